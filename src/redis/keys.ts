// Redis Cluster hash slots, computed here so that a batch of keys can be split into the groups one
// script call may take (a script's keys must all live in one slot): CRC16 (XMODEM) of the key's
// hash tag, modulo 16384, as the Cluster specification defines it.

const TABLE = (() => {
  const table = new Uint16Array(256)
  for (let i = 0; i < 256; i++) {
    let crc = i << 8
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1
    table[i] = crc & 0xffff
  }
  return table
})()

/** The slot of a key whose hash tag is `tag` (the text between its first `{` and the next `}`). */
export function hashSlot(tag: string): number {
  let crc = 0
  for (const byte of Buffer.from(tag, 'utf8'))
    crc = ((crc << 8) & 0xffff) ^ TABLE[((crc >> 8) ^ byte) & 0xff]!
  return crc & 16383
}
