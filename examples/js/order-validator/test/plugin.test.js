// Unit tests of the JavaScript order validator under `node --test`: the same cases as the
// Rust example's tests, plus where JSON.parse and serde_json disagree.

import { beforeEach, test } from 'node:test';
import assert from 'node:assert/strict';
import { accept, reject } from '@sharehost/guest';
import * as testing from '@sharehost/guest/testing';
import OrderValidator, { parseU64 } from '../plugin.js';
import { parse, rustDisplayF64, serdeF64 } from '../json.js';

// A fresh fake host per test: collected logs start empty and are not echoed to stderr.
beforeEach(() => testing.reset());

const judge = (value, config = { 'max-quantity': '10' }) =>
  testing.create(OrderValidator, config).handle(testing.record({ value }));

const reason = (value, config) => {
  const v = judge(value, config);
  assert.equal(v.kind, 'reject', `expected a rejection of ${value}, got ${JSON.stringify(v)}`);
  return v.reason;
};

test('accepts a valid order', () => {
  assert.deepEqual(judge('{"id":"o1","sku":"A-1","quantity":2,"price":9.5}'), accept());
  assert.deepEqual(judge('{"id":"o1","sku":"A-1","quantity":10,"price":0}'), accept());
  assert.deepEqual(judge('{"id":"o1","sku":"A-1","quantity":1,"price":-0.0}'), accept(), '-0 is not negative');
});

test('rejects malformed orders with the same reasons as the Rust validator', () => {
  assert.equal(judge(null, {}).reason, 'null value (tombstone)');
  assert.deepEqual(testing.create(OrderValidator).handle(testing.record({ value: null })), reject('null value (tombstone)'));
  assert.equal(reason('{oops'), 'not JSON');
  assert.equal(reason('[1]'), 'not a JSON object');
  assert.equal(reason('"text"'), 'not a JSON object');
  assert.equal(reason('{"sku":"A","quantity":1,"price":1}'), '`id` missing or not a string');
  assert.equal(reason('{"id":7,"sku":"A","quantity":1,"price":1}'), '`id` missing or not a string');
  assert.equal(reason('{"id":"","sku":"A","quantity":1,"price":1}'), '`id` is empty');
  assert.equal(reason('{"id":"o","quantity":1,"price":1}'), '`sku` missing or not a string');
  assert.equal(reason('{"id":"o","sku":"","quantity":1,"price":1}'), '`sku` is empty');
  assert.equal(reason('{"id":"o","sku":"A","price":1}'), '`quantity` missing or not a non-negative integer');
  assert.equal(reason('{"id":"o","sku":"A","quantity":-1,"price":1}'), '`quantity` missing or not a non-negative integer');
  assert.equal(reason('{"id":"o","sku":"A","quantity":11,"price":1}'), '`quantity` 11 outside 1..=10');
  assert.equal(reason('{"id":"o","sku":"A","quantity":0,"price":1}'), '`quantity` 0 outside 1..=10');
  assert.equal(reason('{"id":"o","sku":"A","quantity":1,"price":-1}'), '`price` -1 is negative');
  assert.equal(reason('{"id":"o","sku":"A","quantity":1,"price":-2.5}'), '`price` -2.5 is negative');
  assert.equal(reason('{"id":"o","sku":"A","quantity":1,"price":"9"}'), '`price` missing or not a number');
  assert.equal(reason('{"id":"o","sku":"A","quantity":1}'), '`price` missing or not a number');
});

test('default max-quantity is 1000; a bad value refuses the configuration with Rust u64 messages', () => {
  assert.equal(reason('{"id":"o","sku":"A","quantity":1001,"price":1}', {}), '`quantity` 1001 outside 1..=1000');
  assert.throws(() => testing.create(OrderValidator, { 'max-quantity': 'x' }), { message: 'max-quantity `x`: invalid digit found in string' });
  assert.throws(() => testing.create(OrderValidator, { 'max-quantity': '' }), { message: 'max-quantity ``: cannot parse integer from empty string' });
  assert.throws(() => testing.create(OrderValidator, { 'max-quantity': '-1' }), /invalid digit found in string/);
  assert.throws(() => testing.create(OrderValidator, { 'max-quantity': '18446744073709551616' }), /number too large to fit in target type/);
  assert.throws(() => testing.run(OrderValidator, [], { config: { 'max-quantity': ' 5' } }), /init refused the configuration: max-quantity ` 5`: invalid digit/);
  assert.equal(parseU64('+7'), 7n, 'Rust accepts a leading +');
  assert.equal(parseU64('007'), 7n);
  assert.equal(parseU64('18446744073709551615'), 2n ** 64n - 1n);
});

test('quantity: only what serde_json reads as a u64 is an integer (not 5.0, 1e2, -0)', () => {
  const q = (lit, max = '1000') => judge(`{"id":"o","sku":"A","quantity":${lit},"price":1}`, { 'max-quantity': max });
  assert.deepEqual(q('5'), accept());
  for (const lit of ['5.0', '1e2', '5E0', '-0', '0.5']) {
    assert.equal(q(lit).reason, '`quantity` missing or not a non-negative integer', lit);
  }
  assert.equal(q('18446744073709551615', '1000').reason, '`quantity` 18446744073709551615 outside 1..=1000', 'exact, not rounded to 2^64');
  assert.equal(q('9007199254740993', '18446744073709551615').kind, 'accept');
  assert.equal(q('18446744073709551616').reason, '`quantity` missing or not a non-negative integer', 'past u64: a float in serde_json');
});

test('JSON that JSON.parse accepts but serde_json refuses is "not JSON"', () => {
  const ok = '{"id":"o","sku":"A","quantity":1,"price":1}';
  assert.equal(reason(`\ufeff${ok}`), 'not JSON', 'a UTF-8 BOM');
  assert.equal(reason(`{"id":"\\ud800","sku":"A","quantity":1,"price":1}`), 'not JSON', 'a lone surrogate escape');
  assert.equal(reason(`{"id":"o","sku":"A","quantity":1,"price":1e400}`), 'not JSON', 'a number out of range');
  assert.equal(reason(`${'['.repeat(128)}${']'.repeat(128)}`), 'not JSON', 'nesting deeper than 127');
  assert.equal(reason(`${'['.repeat(127)}${']'.repeat(127)}`), 'not a JSON object', '127 levels are fine');
  assert.equal(judge(new Uint8Array([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d])).reason, 'not JSON', 'invalid UTF-8');
  assert.deepEqual(judge(`{"id":"\\ud83d\\ude00","sku":"A","quantity":1,"price":1}`), accept(), 'a surrogate pair');
  assert.deepEqual(judge(` \t\r\n${ok} \n`), accept(), 'JSON whitespace around');
  for (const bad of ['', ' ', '{"a":1,}', '[01]', '[1.]', '[-]', '[.5]', "{'a':1}", '{"a":1} x', 'nul', '[1e]', '"\t"', 'NaN', '[Infinity]']) {
    assert.equal(reason(bad), 'not JSON', JSON.stringify(bad));
  }
});

test('a repeated key keeps its last value, as in serde_json', () => {
  assert.deepEqual(judge('{"id":"","id":"o","sku":"A","quantity":1,"price":1}'), accept());
  assert.equal(reason('{"id":"o","sku":"A","quantity":1,"price":1,"price":-3}'), '`price` -3 is negative');
});

test('prices print like Rust {} for f64: shortest digits, never an exponent', () => {
  const cases = [[-1, '-1'], [-2.5, '-2.5'], [-0.1, '-0.1'], [-1e21, '-1000000000000000000000'], [-1.5e-7, '-0.00000015'],
    [-123456789.125, '-123456789.125'], [-1e-7, '-0.0000001'], [-0, '-0'], [0, '0'], [5e-324, '0.' + '0'.repeat(323) + '5'],
    [-1.7976931348623157e308, '-17976931348623157' + '0'.repeat(292)],
    // ties between two shortest candidates: JS's String() picks the even digit, Rust the larger
    [-1140963860933227.25, '-1140963860933227.3'], [99477062663224.625, '99477062663224.63']];
  for (const [x, want] of cases) assert.equal(rustDisplayF64(x), want, String(x));
  assert.equal(reason('{"id":"o","sku":"A","quantity":1,"price":-1e21}'), '`price` -1000000000000000000000 is negative');
  assert.equal(reason('{"id":"o","sku":"A","quantity":1,"price":-12.50}'), '`price` -12.5 is negative');
});

test('the component path: one verdict per record, and the reason travels in the wire verdict', () => {
  const [verdicts] = testing.run(OrderValidator, [[
    { value: '{"id":"o1","sku":"A","quantity":2,"price":9.5}' },
    { value: null },
    { value: '{"id":"o2","sku":"A","quantity":2000,"price":1}' },
  ]]);
  assert.deepEqual(verdicts, [{ tag: 'accept' }, { tag: 'reject', val: 'null value (tombstone)' }, { tag: 'reject', val: '`quantity` 2000 outside 1..=1000' }]);
});

test('the parser keeps strings, numbers, nesting', () => {
  const v = parse('{"a":[1,2.5,"x",true,false,null,{"b":"\\n\\u00e9\\/"}]}');
  const a = v.get('a');
  assert.deepEqual(a.slice(0, 3).map((n) => (typeof n === 'string' ? n : n.literal)), ['1', '2.5', 'x']);
  assert.deepEqual(a.slice(3, 6), [true, false, null]);
  assert.equal(a[6].get('b'), '\n\u00e9/');
});

test('the fast reader (JSON.parse when provably the same) agrees with the strict one on every test record', async () => {
  const { readFileSync } = await import('node:fs');
  const { parseTopLevel, JsonNumber: N } = await import('../json.js');
  const lines = readFileSync(new URL('../testdata/orders.jsonl', import.meta.url), 'utf8').trim().split('\n');
  const extra = ['{"quantity":5,"x":{"quantity":5.0}}', '{"sku":"quantity","quantity":1e2}', '{"a":1,"a":2.0}', '{"q":[1,2],"n":-0}', '7', '{}', ' {"__proto__":1} '];
  const values = [...lines.map((l) => JSON.parse(l).value), ...extra].filter((v) => v !== null);
  const view = (read, v) => {
    let out;
    try {
      out = read(typeof v === 'string' ? v : new Uint8Array(Buffer.from(v.base64, 'base64')));
    } catch {
      return 'error';
    }
    if (!(out instanceof Map)) return `not an object: ${out instanceof N ? 'number' : typeof out}`;
    return JSON.stringify([...out].map(([k, x]) => [k, x instanceof N ? `n:${x.literal}` : typeof x === 'string' ? `s:${x}` : typeof x]));
  };
  assert.ok(values.length > 60);
  for (const v of values) assert.equal(view(parseTopLevel, v), view(parse, v), JSON.stringify(v));
});

test('numbers read as serde_json (no float_roundtrip) reads them, not as JSON.parse does', () => {
  // Values checked against the Rust validator's reasons (testdata/orders.jsonl, offsets 66-70).
  assert.equal(serdeF64('-307924402685.9952890786'), -307924402685.99524, 'one ulp off the nearest double, like serde');
  assert.notEqual(Number('-307924402685.9952890786'), -307924402685.99524);
  assert.throws(() => serdeF64('-1.7976931348623158e308'), RangeError, 'serde: out of range, JSON.parse: the largest double');
  assert.equal(serdeF64('-0.1e309'), -1e308);
  assert.equal(serdeF64('-18446744073709551616.1'), -18446744073709552000);
  assert.throws(() => serdeF64('1e2147483648'), RangeError);
  assert.ok(Object.is(serdeF64('-1e-2147483649'), -0));
  assert.equal(serdeF64('9.5'), 9.5);
  assert.equal(serdeF64('18446744073709551615'), 18446744073709551615);
  assert.equal(reason('{"id":"o","sku":"A","quantity":1,"price":-307924402685.9952890786}'), '`price` -307924402685.99524 is negative');
  assert.equal(reason('{"id":"o","sku":"A","quantity":1,"price":-1.7976931348623158e308}'), 'not JSON');
});
