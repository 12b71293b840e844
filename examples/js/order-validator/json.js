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
/** A run of string characters that need no attention (no quote, backslash or control). */
const PLAIN = /[^"\\\x00-\x1f]*/y;

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
    /** Its value as a double, exactly as serde_json reads it (`as_f64`); see `serdeF64`. */
    this.value = serdeF64(literal);
  }

  /**
   * serde_json's `as_u64`: the exact value as a BigInt when the literal is a non-negative
   * integer without fraction or exponent that fits in 64 bits, else `null`.
   * @returns {bigint | null}
   */
  asU64() {
    const t = this.literal;
    // A valid literal (the readers checked it) is a plain integer when it has no sign,
    // fraction or exponent; native searches, cheaper than a regex inside a component.
    if (t.includes('-') || t.includes('.') || t.includes('e') || t.includes('E')) return null;
    const n = BigInt(t);
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
    if (s.startsWith('true', i)) {
      i += 4;
      return true;
    }
    if (s.startsWith('false', i)) {
      i += 5;
      return false;
    }
    if (s.startsWith('null', i)) {
      i += 4;
      return null;
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
    for (;;) {
      // Skip the plain run natively (a regex), then look at what stopped it.
      PLAIN.lastIndex = i;
      PLAIN.test(s);
      out += s.slice(i, PLAIN.lastIndex);
      i = PLAIN.lastIndex;
      if (i >= s.length) fail('EOF while parsing a string');
      const c = s.charCodeAt(i);
      if (c === 0x22) {
        i++;
        return out;
      }
      if (c < 0x20) fail('control character (\\u0000-\\u001F) found while parsing a string');
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
    try {
      return new JsonNumber(m[0]);
    } catch {
      return fail('number out of range');
    }
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
  // A tie: the double lies exactly halfway between two shortest candidates. JavaScript then
  // picks the even last digit, Rust the larger magnitude (`1140963860933227.25` prints as
  // `...227.2` in JS, `...227.3` in Rust). The even digit never carries when bumped.
  if (digits !== '0' && exactDigits(Math.abs(x)) === `${digits}5`) {
    digits = digits.slice(0, -1) + String(Number(digits[digits.length - 1]) + 1);
  }
  let out;
  if (point <= 0) out = `0.${'0'.repeat(-point)}${digits}`;
  else if (point >= digits.length) out = digits + '0'.repeat(point - digits.length);
  else out = `${digits.slice(0, point)}.${digits.slice(point)}`;
  return sign + out;
}

/**
 * Like `parse`, for readers of a top-level object's members, and several times faster inside
 * a component: when the text provably reads the same under `JSON.parse` and serde_json, the
 * engine's native `JSON.parse` does the work and only the literals of top-level numbers are
 * recovered from the text; otherwise `parse` does it all. Returns a `Map` of the top-level
 * members for an object (numbers as `JsonNumber`s; nested values as `JSON.parse` or `parse`
 * made them), or the document's value for anything else. Throws a `JsonError` whenever
 * `parse` would.
 *
 * Why it is the same: `JSON.parse` refuses everything serde_json refuses except lone surrogate
 * escapes, nesting deeper than 127 and numbers out of range. Text with no backslash has no
 * escapes at all; fewer than 128 brackets cannot nest 128 deep; without an exponent or a
 * 300-digit run no number overflows. And with no escapes, a key written once in the text is a
 * unique token `"key"`, so its value's literal can be read right after it.
 *
 * Written with index loops and native string searches: inside a component the JS runs in an
 * interpreter, where `for...of`, destructuring and regexes cost microseconds each.
 * @param {Uint8Array | string} input
 */
export function parseTopLevel(input) {
  let s;
  if (typeof input === 'string') s = input;
  else {
    try {
      s = utf8.decode(input);
    } catch {
      throw new JsonError('invalid UTF-8', 0);
    }
  }
  if (s.includes('\\') || brackets(s) > MAX_DEPTH || mayOverflow(s)) return parse(s);
  let v;
  try {
    v = JSON.parse(s);
  } catch (e) {
    throw new JsonError(e.message, 0);
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return typeof v === 'number' ? parse(s) : v;
  const map = new Map();
  const keys = Object.keys(v);
  for (let i = 0; i < keys.length; i++) {
    const k = keys[i];
    const x = v[k];
    if (typeof x !== 'number') {
      map.set(k, x);
      continue;
    }
    const token = '"' + k + '"';
    const at = s.indexOf(token);
    if (at < 0 || s.indexOf(token, at + 1) >= 0) return parse(s); // repeated: let `parse` decide
    const literal = numberAfterColon(s, at + token.length);
    if (literal === null) return parse(s);
    map.set(k, new JsonNumber(literal));
  }
  return map;
}

/** The number literal after `[ws] : [ws]` at `i` (the text is valid JSON), or `null`. */
function numberAfterColon(s, i) {
  while (isWs(s.charCodeAt(i))) i++;
  if (s.charCodeAt(i) !== 0x3a) return null;
  i++;
  while (isWs(s.charCodeAt(i))) i++;
  const from = i;
  for (;;) {
    const c = s.charCodeAt(i);
    // digits, `-`, `+`, `.`, `e`, `E`: a valid document's number ends at anything else
    if ((c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2b || c === 0x2e || c === 0x65 || c === 0x45) i++;
    else break;
  }
  return i > from ? s.slice(from, i) : null;
}

function isWs(c) {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

/**
 * Whether a number in the text might be out of the double range: only one with an exponent
 * (a digit then `e`/`E`) or with 300 digits or more can be. Cheap native searches, since a
 * regex runs interpreted inside a component.
 */
function mayOverflow(s) {
  return digitBefore(s, 'e') || digitBefore(s, 'E') || (s.length >= 300 && /[0-9]{300}/.test(s));
}

/** Whether some `c` in the text follows a digit. */
function digitBefore(s, c) {
  for (let at = s.indexOf(c); at > 0; at = s.indexOf(c, at + 1)) {
    const d = s.charCodeAt(at - 1);
    if (d >= 0x30 && d <= 0x39) return true;
  }
  return false;
}

/** How many `[` and `{` the text has (strings included): a bound on its nesting depth. */
function brackets(s) {
  let n = 0;
  for (let at = s.indexOf('['); at >= 0 && n <= MAX_DEPTH; at = s.indexOf('[', at + 1)) n++;
  for (let at = s.indexOf('{'); at >= 0 && n <= MAX_DEPTH; at = s.indexOf('{', at + 1)) n++;
  return n;
}

/**
 * The exact decimal digits of a finite positive double (every double is a finite decimal),
 * without leading or trailing zeros: `0.25` gives `25`. Used to spot formatting ties.
 * @param {number} x
 * @returns {string}
 */
function exactDigits(x) {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const bits = view.getBigUint64(0);
  const biased = Number((bits >> 52n) & 0x7ffn);
  let mant = bits & ((1n << 52n) - 1n);
  let e2;
  if (biased === 0) e2 = -1074;
  else {
    mant |= 1n << 52n;
    e2 = biased - 1075;
  }
  // x = mant * 2^e2; for e2 < 0 that is mant * 5^-e2 / 10^-e2: the same digits as mant * 5^-e2.
  const n = e2 >= 0 ? mant << BigInt(e2) : mant * 5n ** BigInt(-e2);
  return n.toString().replace(/0+$/, '');
}

/** serde_json's powers of ten: the doubles nearest 1e0 ... 1e308 (Rust literals, like JS's). */
const POW10 = Array.from({ length: 309 }, (_, i) => Number(`1e${i}`));
const I32_MAX = 2147483647;

/**
 * The double serde_json 1.x (without its `float_roundtrip` feature, as in this repository)
 * reads from a valid JSON number literal; throws a `RangeError` where serde_json fails with
 * "number out of range".
 *
 * Why not `Number(literal)`: serde_json's default float reader is fast, not correctly
 * rounded. It collects up to 19-20 digits into a u64 (ignoring the rest), converts that to a
 * double and multiplies or divides once by a power of ten, which can land one unit in the last
 * place away from the nearest double for literals of 16 digits or more
 * (`-307924402685.9952890786` reads as `-307924402685.99524`, not `...9953`). A price's reason
 * prints that double, so the JavaScript validator must read the same one. This mirrors
 * serde_json's `parse_integer`, `parse_long_integer`, `parse_decimal`, `parse_exponent` and
 * `f64_from_parts` step by step (BigInt for the u64 significand).
 * @param {string} literal
 * @returns {number}
 */
export function serdeF64(literal) {
  const neg = literal.charCodeAt(0) === 0x2d;
  const start = neg ? 1 : 0;
  const hasExp = literal.includes('e') || literal.includes('E');
  const dot = literal.indexOf('.');
  // Up to 15 digits and no exponent: exact significand, one exact power, one rounding, so
  // serde_json's double is the correctly rounded one. (Integers that fit 64 bits, too: serde
  // keeps them as integers and `as f64` rounds correctly.)
  const digits = literal.length - start - (dot < 0 ? 0 : 1);
  if (!hasExp && (digits <= 15 || (dot < 0 && BigInt(literal.slice(start)) <= U64_MAX))) return Number(literal);

  let i = start;
  let sig = 0n;
  let exp = 0;
  let saturated = false;
  const digitAt = (k) => {
    const c = literal.charCodeAt(k);
    return c >= 0x30 && c <= 0x39 ? c - 0x30 : -1;
  };
  // parse_integer, then parse_long_integer once the u64 would overflow: later digits only
  // raise the exponent.
  for (let d = digitAt(i); d >= 0; d = digitAt(++i)) {
    if (saturated) exp++;
    else if (sig * 10n + BigInt(d) > U64_MAX) {
      saturated = true;
      exp++;
    } else sig = sig * 10n + BigInt(d);
  }
  // parse_decimal: digits join the significand until one would overflow it; from then on
  // the rest of the fraction is ignored.
  if (literal[i] === '.') {
    i++;
    let ignoring = false;
    for (let d = digitAt(i); d >= 0; d = digitAt(++i)) {
      if (ignoring) continue;
      if (sig * 10n + BigInt(d) > U64_MAX) ignoring = true;
      else {
        sig = sig * 10n + BigInt(d);
        exp--;
      }
    }
  }
  // parse_exponent (and parse_exponent_overflow for exponents past i32).
  if (literal[i] === 'e' || literal[i] === 'E') {
    i++;
    let positiveExp = true;
    if (literal[i] === '+') i++;
    else if (literal[i] === '-') {
      positiveExp = false;
      i++;
    }
    let e = 0;
    for (let d = digitAt(i); d >= 0; d = digitAt(++i)) {
      if (e * 10 + d > I32_MAX) {
        if (sig !== 0n && positiveExp) throw new RangeError('number out of range');
        return neg ? -0 : 0;
      }
      e = e * 10 + d;
    }
    exp = positiveExp ? Math.min(exp + e, I32_MAX) : Math.max(exp - e, -I32_MAX - 1);
  }
  // f64_from_parts
  let f = Number(sig);
  for (;;) {
    const a = Math.abs(exp);
    if (a <= 308) {
      if (exp >= 0) {
        f *= POW10[a];
        if (f === Infinity) throw new RangeError('number out of range');
      } else f /= POW10[a];
      break;
    }
    if (f === 0) break;
    if (exp >= 0) throw new RangeError('number out of range');
    f /= 1e308;
    exp += 308;
  }
  return neg ? -f : f;
}
