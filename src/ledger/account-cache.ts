import type { FastifyInstance } from 'fastify'

// Cache keys are built from ids the gateway parsed and bounded, never from raw request text.
export const accountCacheKey = (accountId: number) => `account:${accountId}`
export const accountsCacheKey = (customerId: number) => `accounts:${customerId}`

/**
 * Called once a transfer has committed (POST /transfers and a scheduled run): drops both balances
 * and both owners' account lists. Never throws (the money has moved); failures are logged and
 * counted, and the TTL bounds them. The recipient comes from the transfer's own lock query (no
 * extra statement). A replay drops both sides again: the first attempt may have committed and died
 * before its invalidation.
 */
export async function invalidateAfterTransfer(
  cache: Pick<FastifyInstance['cache'], 'enabled' | 'invalidate'>,
  customerId: number,
  transfer: { fromAccountId: number; toAccountId: number },
  recipientCustomerId?: number,
): Promise<void> {
  if (!cache.enabled) return
  const keys = [
    accountCacheKey(transfer.fromAccountId),
    accountCacheKey(transfer.toAccountId),
    accountsCacheKey(customerId),
  ]
  if (recipientCustomerId !== undefined && recipientCustomerId !== customerId) {
    keys.push(accountsCacheKey(recipientCustomerId))
  }
  await cache.invalidate(keys)
}
