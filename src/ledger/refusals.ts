import { DomainError } from '../domain-error.ts'

/** The transfer statement's verdicts that refuse the transfer (see TRANSFER_SQL in ledger.ts). */
export type RefusedVerdict =
  | 'same-account'
  | 'from-not-found'
  | 'to-not-found'
  | 'currency-from'
  | 'currency-to'
  | 'insufficient'

export const sameAccount = () => new DomainError('same-account', 'fromAccountId and toAccountId must differ.')

/** Another customer's account is refused exactly like a missing one, so ids cannot be probed. */
export const accountNotFound = (accountId: number) =>
  new DomainError('account-not-found', `Account ${accountId} does not exist or is not yours.`)

/** The refusal a transfer statement's verdict stands for, with the detail the client is told. */
export function refusalOf(
  verdict: RefusedVerdict,
  transfer: { fromAccountId: number; toAccountId: number; amount: number; currency: string },
  fromCurrency: string | null,
): DomainError {
  const { fromAccountId, toAccountId, amount, currency } = transfer
  switch (verdict) {
    case 'same-account':
      return sameAccount()
    case 'from-not-found':
      return accountNotFound(fromAccountId)
    case 'to-not-found':
      return accountNotFound(toAccountId)
    case 'currency-from':
      return new DomainError(
        'currency-mismatch',
        `The transfer is in ${currency}; account ${fromAccountId} holds ${fromCurrency}.`,
      )
    // The recipient may be another customer: its currency is not ours to disclose.
    case 'currency-to':
      return new DomainError(
        'currency-mismatch',
        `The transfer is in ${currency}; account ${toAccountId} cannot receive it.`,
      )
    case 'insufficient':
      return new DomainError(
        'insufficient-funds',
        `Account ${fromAccountId} does not hold ${amount} ${currency}.`,
      )
    default:
      throw new Error(`unexpected transfer verdict ${verdict satisfies never}`)
  }
}
