/**
 * Validates JSON orders and rejects malformed ones with a reason: the JavaScript twin of
 * examples/order-validator (Rust). Same input, same verdicts, same reason strings.
 *
 * An order is a JSON object `{"id": "...", "sku": "...", "quantity": N, "price": X}` with a
 * non-empty `id` and `sku`, `quantity` an integer in `1..=max-quantity`, and `price` a
 * non-negative number. Anything else is rejected (so it never comes back, and lands in the
 * dead-letter topic when one is configured) with a reason saying what is wrong.
 *
 * Configuration: `max-quantity` (default 1000), read like Rust's `u64` parse.
 */

import { Plugin, accept, log, reject } from '@sharehost/guest';
import { JsonNumber, parseTopLevel, rustDisplayF64 } from './json.js';

const U64_MAX = 18446744073709551615n;
/** The members that must be non-empty strings, in the order the Rust validator checks them. */
const STRING_FIELDS = ['id', 'sku'];

/**
 * Reads `text` as an unsigned 64-bit integer exactly like Rust's `str::parse::<u64>`, with
 * the same error messages (they reach the operator when a configuration is refused).
 * @param {string} text
 * @returns {bigint}
 */
export function parseU64(text) {
  if (text.length === 0) throw new Error('cannot parse integer from empty string');
  const digits = text[0] === '+' && text.length > 1 ? text.slice(1) : text;
  if (!/^[0-9]+$/.test(digits)) throw new Error('invalid digit found in string');
  const n = BigInt(digits);
  if (n > U64_MAX) throw new Error('number too large to fit in target type');
  return n;
}

/** The order validator. State across batches: only the configured maximum. */
export default class OrderValidator extends Plugin {
  /** Reads `max-quantity`; a value that is not a u64 refuses the configuration. */
  init(config) {
    const s = config.get('max-quantity');
    /** @type {bigint} */
    this.maxQuantity = 1000n;
    if (s !== undefined) {
      try {
        this.maxQuantity = parseU64(s);
      } catch (e) {
        throw new Error(`max-quantity \`${s}\`: ${e.message}`);
      }
    }
  }

  /**
   * Checks one value; returns the rejection reason, or `null` when the order is valid.
   * @param {Uint8Array | null} value
   * @returns {string | null}
   */
  check(value) {
    if (value === null) return 'null value (tombstone)';
    let order;
    try {
      order = parseTopLevel(value);
    } catch (e) {
      // The reason is the same in every language; the parser's own message goes to the log.
      log.debug(`not JSON: ${e.message}`);
      return 'not JSON';
    }
    if (!(order instanceof Map)) return 'not a JSON object';
    // (an index loop: `for...of` is slow in the component's interpreter)
    for (let i = 0; i < STRING_FIELDS.length; i++) {
      const field = STRING_FIELDS[i];
      const v = order.get(field);
      if (typeof v !== 'string') return `\`${field}\` missing or not a string`;
      if (v.length === 0) return `\`${field}\` is empty`;
    }
    const q = order.get('quantity');
    const quantity = q instanceof JsonNumber ? q.asU64() : null;
    if (quantity === null) return '`quantity` missing or not a non-negative integer';
    if (quantity === 0n || quantity > this.maxQuantity) {
      return `\`quantity\` ${quantity} outside 1..=${this.maxQuantity}`;
    }
    const p = order.get('price');
    if (!(p instanceof JsonNumber)) return '`price` missing or not a number';
    if (p.value >= 0) return null;
    return `\`price\` ${rustDisplayF64(p.value)} is negative`;
  }

  /** Accepts a valid order, rejects anything else with the reason. */
  handle(record) {
    const reason = this.check(record.value);
    if (reason === null) return accept();
    log.debug(`offset ${record.offset}: ${reason}`);
    return reject(reason);
  }
}
