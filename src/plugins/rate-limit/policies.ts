import type { RouteOptions } from 'fastify'
import { describeValue } from '../../redis/client.ts'
import { routeName } from '../common/route-hooks.ts'
import { RateLimitPolicyConflictError, RateLimitUnknownPolicyError } from './errors.ts'
import { pluginCheck, type RateLimitSettings } from './options.ts'
import { normalizePolicy, type PolicyContext, signature } from './policy.ts'
import type { Policy, RateLimitPolicy, RouteRateLimit } from './types.ts'

/**
 * The policies of one plugin instance, by name: its `policies` (every route registered after it),
 * its `namedPolicies` (where a route or app.rateLimiter names them) and those routes define in
 * their `config.rateLimits`. One name is one counter: a name defined again with other settings
 * fails the boot, and the same settings give back the policy already defined.
 */
export class PolicyBook {
  /** The plugin's `policies`. */
  readonly global: readonly Policy[]
  private readonly named: ReadonlyMap<string, Policy>
  private readonly known = new Map<string, { signature: string; policy: Policy }>()
  private readonly defaults: Partial<RateLimitPolicy>
  private readonly context: PolicyContext

  constructor(
    { policies, namedPolicies, defaults }: Pick<RateLimitSettings, 'policies' | 'namedPolicies' | 'defaults'>,
    context: PolicyContext,
  ) {
    this.defaults = defaults
    this.context = context
    this.global = policies.map((raw) => this.define(raw))
    this.named = new Map(namedPolicies.map((raw) => [raw.name, this.define(raw)]))
  }

  /** Neither `policies` nor `namedPolicies`: only routes' own policies can limit anything. */
  get empty(): boolean {
    return this.global.length === 0 && this.named.size === 0
  }

  /** Every policy defined so far, once each. */
  get all(): Policy[] {
    return [...this.known.values()].map(({ policy }) => policy)
  }

  /** Checks a policy and keeps it under its name; `where` says where it was written. */
  define(raw: RateLimitPolicy, where = ''): Policy {
    const policy = normalizePolicy(raw, this.defaults, this.context, where)
    const sig = signature(raw, this.defaults)
    const seen = this.known.get(policy.name)
    if (seen && seen.signature !== sig) {
      throw new RateLimitPolicyConflictError(
        `rate-limit plugin: ${where}policy '${policy.name}' is defined twice with different settings`,
        policy.name,
      )
    }
    if (!seen) this.known.set(policy.name, { signature: sig, policy })
    return seen?.policy ?? policy
  }

  /** The policies of a route: the plugin's, then those its `config.rateLimits` gives or names. */
  ofRoute(route: RouteOptions, config: RouteRateLimit | undefined): Policy[] {
    if (config === false) return []
    const own = config === undefined ? [] : [config].flat().map((entry) => this.routeEntry(route, entry))
    return [...this.global, ...own]
  }

  /** A policy by name, if one is defined. */
  find(name: string): Policy | undefined {
    return this.known.get(name)?.policy
  }

  /** A policy by name, for app.rateLimiter's `caller`. */
  byName(name: string, caller: string): Policy {
    const found = typeof name === 'string' ? this.known.get(name) : undefined
    if (!found)
      throw new RateLimitUnknownPolicyError(
        `rate-limit plugin: ${caller}: unknown policy '${String(name)}'${this.known.size ? ` (policies: ${[...this.known.keys()].join(', ')})` : ''}`,
        String(name),
      )
    return found.policy
  }

  private routeEntry(route: RouteOptions, entry: unknown): Policy {
    const where = `route ${routeName(route)}: config.rateLimits: `
    if (typeof entry === 'object' && entry !== null && !Array.isArray(entry))
      return this.define(entry as RateLimitPolicy, where)
    if (typeof entry !== 'string')
      pluginCheck.fail(
        `${where}each entry must be a policy or the name of one of \`namedPolicies\`, got ${describeValue(entry)} (false, alone, turns every policy off)`,
      )
    const policy = this.named.get(entry as string)
    if (!policy)
      throw new RateLimitUnknownPolicyError(
        `rate-limit plugin: route ${routeName(route)} names unknown policy '${entry}'${this.named.size ? ` (namedPolicies: ${[...this.named.keys()].join(', ')})` : ' (the plugin has no namedPolicies)'}`,
        entry as string,
      )
    return policy
  }
}
