/**
 * A JSON reader that accepts exactly what Rust's `serde_json::from_slice::<Value>` accepts,
 * and keeps each number's literal text. Why: `JSON.parse` is more lenient than serde_json
 * (lone surrogate escapes, nesting deeper than 128, `1e400` as Infinity, a UTF-8 BOM once
 * decoded) and forgets how a number was written, so it cannot tell `5` from `5.0` or `1e2`,
 * which serde_json keeps apart (only `5` is an integer). The order validator must give the
 * same verdict as the Rust one for the same bytes.
 *
 * Values: objects are `Map`s (a repeated key: the last value wins, as in serde_json), arrays
 * are arrays, strings, booleans and `null` as usual, numbers are `JsonNumber`s.
 */

/** serde_json's default recursion limit: at most 127 nested arrays/objects. */
const MAX_DEPTH = 127;
const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
const U64_MAX = 18446744073709551615n;

/** Why a reader refused its input (the message is for logs; reasons stay fixed). */
export class JsonError extends Error {
  constructor(message, at) {
    super(`${message} at ${at}`);
    this.name = 'JsonError';
  }
}

/** A JSON number as written, with serde_json's view of it. */
export class JsonNumber {
  /** @param {string} literal the number's text in the document */
  constructor(literal) {
    /** The literal text, e.g. `5`, `5.0`, `1e2`, `-0`. */
    this.literal = literal;
    /** Its value as a double (what serde_json's `as_f64` gives, up to rounding; see README). */
    this.value = Number(literal);
  }

  /**
   * serde_json's `as_u64`: the exact value as a BigInt when the literal is a non-negative
   * integer without fraction or exponent that fits in 64 bits, else `null`.
   * @returns {bigint | null}
   */
  asU64() {
    if (!/^(0|[1-9][0-9]*)$/.test(this.literal)) return null;
    const n = BigInt(this.literal);
    return n <= U64_MAX ? n : null;
  }
}

/**
 * Parses bytes (or text) as one JSON document; throws a `JsonError` for anything
 * serde_json refuses: invalid UTF-8, a BOM, trailing characters, control characters or lone
 * surrogate escapes in strings, numbers out of the double range, nesting deeper than 127.
 * @param {Uint8Array | string} input
 */
export function parse(input) {
  let s;
  if (typeof input === 'string') s = input;
  else {
    try {
      s = utf8.decode(input);
    } catch {
      throw new JsonError('invalid UTF-8', 0);
    }
  }
  let i = 0;
  let depth = 0;

  const ws = () => {
    while (i < s.length) {
      const c = s.charCodeAt(i);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i++;
      else break;
    }
  };
  const fail = (msg) => {
    throw new JsonError(msg, i);
  };

  const value = () => {
    ws();
    if (i >= s.length) fail('EOF while parsing a value');
    const c = s[i];
    if (c === '{') return object();
    if (c === '[') return array();
    if (c === '"') return string();
    if (c === '-' || (c >= '0' && c <= '9')) return number();
    for (const [word, v] of [['true', true], ['false', false], ['null', null]]) {
      if (s.startsWith(word, i)) {
        i += word.length;
        return v;
      }
    }
    return fail('expected value');
  };

  const nest = () => {
    if (++depth > MAX_DEPTH) fail('recursion limit exceeded');
  };

  const object = () => {
    nest();
    i++;
    const map = new Map();
    ws();
    if (s[i] === '}') {
      i++;
      depth--;
      return map;
    }
    for (;;) {
      ws();
      if (s[i] !== '"') fail('key must be a string');
      const k = string();
      ws();
      if (s[i] !== ':') fail('expected `:`');
      i++;
      map.set(k, value());
      ws();
      if (s[i] === ',') {
        i++;
        continue;
      }
      if (s[i] === '}') {
        i++;
        depth--;
        return map;
      }
      fail('expected `,` or `}`');
    }
  };

  const array = () => {
    nest();
    i++;
    const out = [];
    ws();
    if (s[i] === ']') {
      i++;
      depth--;
      return out;
    }
    for (;;) {
      out.push(value());
      ws();
      if (s[i] === ',') {
        i++;
        continue;
      }
      if (s[i] === ']') {
        i++;
        depth--;
        return out;
      }
      fail('expected `,` or `]`');
    }
  };

  const hex4 = () => {
    const h = s.slice(i, i + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(h)) fail('invalid escape');
    i += 4;
    return parseInt(h, 16);
  };

  const string = () => {
    i++;
    let out = '';
    let from = i;
    for (;;) {
      if (i >= s.length) fail('EOF while parsing a string');
      const c = s.charCodeAt(i);
      if (c === 0x22) {
        out += s.slice(from, i);
        i++;
        return out;
      }
      if (c < 0x20) fail('control character (\\u0000-\\u001F) found while parsing a string');
      if (c !== 0x5c) {
        i++;
        continue;
      }
      out += s.slice(from, i);
      i++;
      const e = s[i++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          const u = hex4();
          if (u >= 0xdc00 && u <= 0xdfff) fail('lone trailing surrogate in hex escape');
          if (u >= 0xd800 && u <= 0xdbff) {
            if (s[i] !== '\\' || s[i + 1] !== 'u') fail('unexpected end of hex escape');
            i += 2;
            const lo = hex4();
            if (lo < 0xdc00 || lo > 0xdfff) fail('lone leading surrogate in hex escape');
            out += String.fromCharCode(u, lo);
          } else out += String.fromCharCode(u);
          break;
        }
        default:
          fail('invalid escape');
      }
      from = i;
    }
  };

  const number = () => {
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(s);
    if (m === null) fail('invalid number');
    const next = s[i + m[0].length];
    // serde_json refuses `01`, `1.`, `1e`, `-`: the regex stops early and leaves a digit,
    // a dot or an exponent behind.
    if (next !== undefined && /[0-9.eE+-]/.test(next)) fail('invalid number');
    i += m[0].length;
    const n = new JsonNumber(m[0]);
    if (!Number.isFinite(n.value)) fail('number out of range');
    return n;
  };

  const v = value();
  ws();
  if (i < s.length) fail('trailing characters');
  return v;
}

/**
 * Formats a double the way Rust's `{}` (Display) does for `f64`: the shortest digits that
 * read back as the same double (like JavaScript's `String(x)`), but never in exponent
 * notation (`1e21` is `1000000000000000000000`, `1e-7` is `0.0000001`), and `-0` for minus zero.
 * @param {number} x
 * @returns {string}
 */
export function rustDisplayF64(x) {
  if (Number.isNaN(x)) return 'NaN';
  if (x === Infinity) return 'inf';
  if (x === -Infinity) return '-inf';
  const sign = x < 0 || Object.is(x, -0) ? '-' : '';
  const [mantissa, exp = '0'] = String(Math.abs(x)).split('e');
  const [int, frac = ''] = mantissa.split('.');
  let digits = int + frac;
  let point = int.length + Number(exp);
  while (digits.length > 1 && digits[0] === '0') {
    digits = digits.slice(1);
    point--;
  }
  let out;
  if (point <= 0) out = `0.${'0'.repeat(-point)}${digits}`;
  else if (point >= digits.length) out = digits + '0'.repeat(point - digits.length);
  else out = `${digits.slice(0, point)}.${digits.slice(point)}`;
  return sign + out;
}
