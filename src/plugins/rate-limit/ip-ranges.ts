import { ipv6Groups } from './keys.ts'

// Overrides of an IP range: an override whose key is `ip:<network>/<prefix>` (`ip:203.0.113.0/24`,
// `ip:2001:db8::/32`) applies to every identity `ip:<address>` inside it, as keyBy.ip returns them
// (an IPv4 address, or an IPv6 client's /64 written `ip:2001:db8:0:1::/64`).

/** An address or a network: its family, its first `prefix` bits (the rest zero) and the prefix length. */
export interface Network {
  v6: boolean
  bits: bigint
  prefix: number
}

const IPV4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/

/** `1.2.3.4`, `1.2.3.0/24`, `2001:db8::1`, `2001:db8::/32`; null if it is none of them or has host bits set past a prefix. */
export function parseNetwork(text: string): Network | null {
  const slash = text.indexOf('/')
  const address = slash === -1 ? text : text.slice(0, slash)
  let bits: bigint
  let v6: boolean
  const v4 = IPV4.exec(address)
  if (v4) {
    const octets = v4.slice(1).map(Number)
    if (octets.some((o) => o > 255)) return null
    bits = BigInt(((octets[0]! << 24) >>> 0) + (octets[1]! << 16) + (octets[2]! << 8) + octets[3]!)
    v6 = false
  } else {
    const groups = address.indexOf(':') === -1 || address.includes('%') ? null : ipv6Groups(address)
    if (!groups) return null
    bits = groups.reduce((value, group) => (value << 16n) | BigInt(group), 0n)
    v6 = true
  }
  const width = v6 ? 128 : 32
  const prefixText = slash === -1 ? String(width) : text.slice(slash + 1)
  if (!/^\d{1,3}$/.test(prefixText) || Number(prefixText) > width) return null
  const prefix = Number(prefixText)
  if (networkOf(bits, width, prefix) !== bits) return null
  return { v6, bits, prefix }
}

const networkOf = (bits: bigint, width: number, prefix: number) =>
  prefix === 0 ? 0n : (bits >> BigInt(width - prefix)) << BigInt(width - prefix)

/** Values by network; `find` gives the most specific live one holding an address or a smaller network. */
export class RangeTable<T> {
  /** Per family, per prefix length (longest first), the values by network. */
  private readonly families = { v4: new Map<number, Map<bigint, T>>(), v6: new Map<number, Map<bigint, T>>() }

  add(network: Network, value: T): void {
    const family = network.v6 ? this.families.v6 : this.families.v4
    let byNetwork = family.get(network.prefix)
    if (!byNetwork) {
      byNetwork = new Map()
      family.set(network.prefix, byNetwork)
      // Longest prefix first: the most specific range is found first.
      const sorted = [...family].sort(([a], [b]) => b - a)
      family.clear()
      for (const [prefix, values] of sorted) family.set(prefix, values)
    }
    byNetwork.set(network.bits, value)
  }

  find(address: Network, live: (value: T) => boolean): T | undefined {
    const family = address.v6 ? this.families.v6 : this.families.v4
    const width = address.v6 ? 128 : 32
    for (const [prefix, byNetwork] of family) {
      // A network identity (an IPv6 /64) is inside a range only if the range is as wide or wider.
      if (prefix > address.prefix) continue
      const value = byNetwork.get(networkOf(address.bits, width, prefix))
      if (value !== undefined && live(value)) return value
    }
    return undefined
  }
}

/** The network an override key names (`ip:` and a network with a prefix), or null for any other key. */
export function rangeOfKey(key: string): Network | null {
  if (!key.startsWith('ip:') || key.indexOf('/') === -1) return null
  return parseNetwork(key.slice(3))
}
