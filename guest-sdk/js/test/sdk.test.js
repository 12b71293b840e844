// Unit tests of the SDK itself, natively (node --test): columnar decoding, verdicts, config,
// emit through the fake host, and the init/handle path the component glue runs.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  Config, EmitError, Plugin, Record, accept, log, recordsOf, reject, release, renew, retry, text,
} from '../src/index.js';
import * as testing from '../src/testing.js';

const bytes = (s) => new TextEncoder().encode(s);

test('records decode spans lazily, null distinct from empty, as views into the batch data', () => {
  const b = testing.batch([
    { key: 'k', value: 'v1', headers: [['h', 'x'], ['n', null], ['h', 'y']], topic: 'orders', partition: 3, offset: 41n, timestamp: 1700000000123, deliveryCount: 2 },
    { key: null, value: null },
    { key: '', value: '' },
  ]);
  const [a, tomb, empty] = recordsOf(b);
  assert.equal(a.keyText(), 'k');
  assert.equal(a.valueText(), 'v1');
  assert.equal(a.value.buffer, b.data.buffer, 'a view, not a copy');
  assert.equal(a.topic, 'orders');
  assert.equal(a.partition, 3);
  assert.equal(a.offset, 41);
  assert.equal(a.offsetBigInt, 41n);
  assert.equal(a.timestamp, 1700000000123);
  assert.equal(a.deliveryCount, 2);
  assert.equal(a.idempotencyKey, 'orders/3/41');
  assert.deepEqual(a.headers.map((h) => [h.key, text(h.value)]), [['h', 'x'], ['n', null], ['h', 'y']]);
  assert.equal(a.headerText('h'), 'x', 'first header of a name');
  assert.equal(a.header('n'), null, 'present with a null value');
  assert.equal(a.header('missing'), undefined);
  assert.equal(tomb.key, null);
  assert.equal(tomb.value, null);
  assert.equal(tomb.valueText(), null);
  assert.deepEqual(tomb.headers, []);
  assert.deepEqual(empty.key, new Uint8Array(0));
  assert.equal(empty.valueText(), '');
  assert.deepEqual([a.index, tomb.index, empty.index], [0, 1, 2]);
});

test('a record reads the raw 0xffffffff null span and the header ranges of a hand-made wire batch', () => {
  const data = bytes('KEYVALhk');
  const b = {
    topics: ['t0', 't1'], topicIndex: [1], partitions: [0], offsets: [2n ** 60n], timestamps: [-5n],
    deliveryCounts: [7], keySpans: [0, 3], valueSpans: [0xffffffff, 0], headerRanges: [0, 1],
    headerSpans: [6, 1, 7, 1], data,
  };
  const [r] = recordsOf(b);
  assert.equal(r.topic, 't1');
  assert.equal(r.keyText(), 'KEY');
  assert.equal(r.value, null);
  assert.equal(r.headerText('h'), 'k');
  assert.equal(r.offsetBigInt, 2n ** 60n, 'exact beyond 2^53');
  assert.equal(r.offset, 2 ** 60, 'a number, rounded beyond 2^53');
  assert.equal(r.timestamp, -5);
});

test('text() is null for null and for invalid UTF-8, and keeps a BOM', () => {
  assert.equal(text(null), null);
  assert.equal(text(new Uint8Array([0xff, 0x41])), null);
  assert.equal(text(new Uint8Array([0xef, 0xbb, 0xbf, 0x41])), '\ufeffA');
});

test('verdict constructors', () => {
  assert.deepEqual(accept(), { kind: 'accept' });
  assert.deepEqual(release(), { kind: 'release' });
  assert.deepEqual(renew(), { kind: 'renew' });
  assert.deepEqual(reject(), { kind: 'reject', reason: null });
  assert.deepEqual(reject('bad'), { kind: 'reject', reason: 'bad' });
  assert.deepEqual(retry(250.9), { kind: 'retry', afterMs: 250 });
  assert.deepEqual(retry(2 ** 40), { kind: 'retry', afterMs: 0xffffffff }, 'saturates');
  assert.throws(() => retry(-1), RangeError);
  assert.throws(() => retry('5'), RangeError);
});

test('config: last value wins, fallback, secrets kept apart and never printed', () => {
  const c = new Config([['a', '1'], ['a', '2'], ['url', 'http://x']], { 'api-token': 's3cret' });
  assert.equal(c.get('a'), '2');
  assert.equal(c.get('missing'), undefined);
  assert.equal(c.get('missing', '1000'), '1000');
  assert.equal(c.has('url'), true);
  assert.equal(c.secret('api-token'), 's3cret');
  assert.equal(c.get('api-token'), undefined);
  assert.equal(c.secret('nope'), undefined);
  assert.equal(c.entries().length, 3);
  const shown = JSON.stringify(c) + String(c) + inspect(c);
  assert.ok(!shown.includes('s3cret'), shown);
  assert.ok(shown.includes('api-token'), shown);
});

function inspect(v) {
  return v[Symbol.for('nodejs.util.inspect.custom')]();
}

class Echo extends Plugin {
  init(config) {
    const fail = config.get('fail');
    if (fail !== undefined) throw new Error(fail);
    this.seen = 0;
  }

  handle(record) {
    this.seen++;
    switch (record.headerText('verdict')) {
      case 'release': return release();
      case 'renew': return renew();
      case 'retry': return retry(100);
      case undefined: return accept();
      default: return reject(record.headerText('verdict'));
    }
  }
}

test('run: init, then one wire verdict per record, in order; state lives across batches', () => {
  const p = new Echo();
  const out = testing.run(p, [
    [{ value: 'x' }, { headers: { verdict: 'renew' } }, { headers: { verdict: 'bad' } }],
    [{ headers: { verdict: 'retry' } }, { headers: { verdict: 'release' } }],
  ]);
  assert.deepEqual(out, [
    [{ tag: 'accept' }, { tag: 'renew' }, { tag: 'reject', val: 'bad' }],
    [{ tag: 'retry', val: 100 }, { tag: 'release' }],
  ]);
  assert.equal(p.seen, 5, 'the same instance judged both batches');
});

test('init refuses a configuration with the thrown message', () => {
  assert.throws(() => testing.run(Echo, [], { config: { fail: 'max must be a number' } }), /init refused the configuration: max must be a number/);
  assert.throws(() => testing.create(Echo, { fail: 'no' }), /^Error: no$/);
});

test('a wrong verdict or count is a clear error, logged before it faults the batch', () => {
  testing.reset();
  const forgotParens = { handle: () => accept };
  assert.throws(() => testing.run(forgotParens, [[{ value: 'x' }]]), /returned the function accept \(missing "\(\)"\?\)/);
  const short = { handleBatch: () => [accept()] };
  assert.throws(() => testing.run(short, [[{}, {}]]), /handleBatch returned 1 verdicts for 2 records/);
  const logs = testing.takeLogs();
  assert.equal(logs.length, 2);
  assert.equal(logs[0].level, 'error');
  assert.match(logs[0].message, /plugin threw while judging a batch of 1/);
});

test('async plugins: init, handle and handleBatch may return Promises, settled in batch order', async () => {
  const calls = [];
  const plugin = {
    async init(config) {
      await null;
      this.tag = config.get('tag');
    },
    async handle(record) {
      await null;
      calls.push(record.valueText());
      return record.valueText() === 'r' ? reject(this.tag) : accept();
    },
  };
  assert.deepEqual(await testing.run(plugin, [[{ value: 'a' }, { value: 'r' }], [{ value: 'b' }]], { config: { tag: 't' } }), [
    [{ tag: 'accept' }, { tag: 'reject', val: 't' }],
    [{ tag: 'accept' }],
  ]);
  assert.deepEqual(calls, ['a', 'r', 'b']);
  await assert.rejects(() => testing.run({ async init() { throw new Error('no token'); }, handle: () => accept() }, []), /init refused the configuration: no token/);
  await assert.rejects(() => testing.run({ handleBatch: async () => [accept()] }, [[{}, {}]]), /handleBatch returned 1 verdicts for 2 records/);
  testing.reset();
  await assert.rejects(() => testing.run({ handle: async () => { throw new RangeError('late'); } }, [[{}]]), /late/);
  assert.match(testing.takeLogs()[0].message, /plugin threw while judging a batch of 1: RangeError: late/);
});

test('fetch under test: a mock answers, requests are kept, no mock is a network error', async () => {
  testing.reset();
  await assert.rejects(() => fetch('http://127.0.0.1:8088/price/A-1'), (e) => e instanceof TypeError && /NetworkError/.test(e.message));
  assert.equal(testing.takeRequests().length, 1, 'a refused request is kept too');
  testing.mockFetch(async (req) => (req.url.endsWith('/A-1') ? Response.json({ unit_price: 2.5 }) : new Response('', { status: 404 })));
  const [a, z] = await Promise.all([
    fetch('http://127.0.0.1:8088/price/A-1', { headers: { authorization: 'Bearer t' } }),
    fetch('http://127.0.0.1:8088/price/Z-9'),
  ]);
  assert.deepEqual([a.status, await a.json(), z.status], [200, { unit_price: 2.5 }, 404]);
  const sent = testing.takeRequests();
  assert.deepEqual(sent.map((r) => [r.method, r.url, r.headers.get('authorization')]), [
    ['GET', 'http://127.0.0.1:8088/price/A-1', 'Bearer t'],
    ['GET', 'http://127.0.0.1:8088/price/Z-9', null],
  ]);
  assert.deepEqual(testing.takeRequests(), []);
  testing.mockFetch(() => { throw testing.networkError(); });
  await assert.rejects(() => fetch('http://127.0.0.1:8088/x'), /NetworkError/);
  testing.reset();
});

test('stacks in a bundle read as the plugin source lines the build recorded', async () => {
  const { mapStack, where } = await import('../src/stack.js');
  const lines = { files: ['plugin.js', '../../guest-sdk/js/src/index.js'], lines: [null, [0, 10], [0, 11], [1, 700]] };
  assert.equal(mapStack('check@bundle.js:3:9\nhandle@bundle.js:4:2\nother', lines), 'check@plugin.js:11\nhandle@../../guest-sdk/js/src/index.js:700\nother');
  const e = new Error('x');
  e.stack = 'map@bundle.js:4:1\ncheck@bundle.js:2:5\n';
  assert.equal(where(e, lines), 'plugin.js:10 in check', 'the innermost frame of the plugin, not the SDK');
  assert.equal(where('not an error', lines), '');
});

test('valueText and keyText are string | null in the types, and null for bytes that are not UTF-8', async () => {
  const { readFileSync } = await import('node:fs');
  const dts = readFileSync(new URL('../types/index.d.ts', import.meta.url), 'utf8');
  assert.match(dts, /\n\s*keyText\(\): string \| null;/);
  assert.match(dts, /\n\s*valueText\(\): string \| null;/);
  const [bad] = testing.records([{ key: new Uint8Array([0xff]), value: new Uint8Array([0xc3, 0x28]) }]);
  assert.equal(bad.valueText(), null);
  assert.equal(bad.keyText(), null);
});

test('a plugin with neither handle nor handleBatch is refused at init', () => {
  assert.throws(() => testing.run({ init() {} }, []), /neither handle\(record\) nor handleBatch\(records\)/);
});

test('emits are collected with their record index; refusals throw EmitError', () => {
  testing.reset();
  const [a, b] = testing.records([{ value: 'a' }, { value: 'b' }]);
  b.emit('urgent', { key: 'k', value: b.value, headers: { kind: 'order' } });
  a.emit('normal');
  const emits = testing.takeEmits();
  assert.equal(emits.length, 2);
  assert.equal(emits[0].recordIndex, 1);
  assert.equal(emits[0].output, 'urgent');
  assert.deepEqual(emits[0].key, bytes('k'));
  assert.deepEqual(emits[0].value, bytes('b'));
  assert.deepEqual(emits[0].headers, [{ key: 'kind', value: bytes('order') }]);
  assert.deepEqual([emits[1].recordIndex, emits[1].key, emits[1].value], [0, null, null]);
  assert.deepEqual(testing.takeEmits(), [], 'take clears');

  assert.throws(() => a.emit('x', { headers: [['sharehost.source.topic', 't']] }), (e) => {
    assert.ok(e instanceof EmitError);
    assert.equal(e.kind, 'reserved-header');
    assert.equal(e.detail, 'sharehost.source.topic');
    assert.match(e.message, /reserved `sharehost.` prefix/);
    return true;
  });
  testing.refuseEmits((e) => (e.output === 'nope' ? new EmitError('unknown-output', 'nope') : null));
  assert.throws(() => a.emit('nope', { value: 'v' }), /unknown output `nope`/);
  a.emit('fine', { value: 'v' });
  assert.equal(testing.takeEmits().length, 1, 'only the accepted emit is collected');
  assert.throws(() => a.emit(42), TypeError);
});

test('log writes one formatted line per call to the fake host', () => {
  testing.reset();
  log.info('count', 3, { a: 1n }, bytes('xy'));
  log.debug('d');
  log.warn('w');
  log.error(new Error('boom'));
  log.trace('t');
  const logs = testing.takeLogs();
  assert.deepEqual(logs.slice(0, 4).map((l) => l.level), ['info', 'debug', 'warn', 'error']);
  assert.equal(logs[0].message, 'count 3 {"a":"1n"} "Uint8Array(2)"');
  assert.match(logs[3].message, /boom/);
  assert.equal(logs[4].level, 'trace');
});

test('a test record defaults: index 0, topic test, offset 0, empty value, null key', () => {
  const r = testing.record();
  assert.ok(r instanceof Record);
  assert.deepEqual([r.index, r.topic, r.offset, r.partition, r.deliveryCount, r.key, r.valueText()], [0, 'test', 0, 0, 1, null, '']);
});
