import { test } from 'node:test';
import assert from 'node:assert/strict';
import { accept, reject } from '@sharehost/guest';
import * as testing from '@sharehost/guest/testing';
import {{type}} from '../plugin.js';

test('tombstones and large values are rejected', () => {
  const p = testing.create({{type}}, { 'max-bytes': '3' });
  assert.deepEqual(p.handle(testing.record({ value: 'abc' })), accept());
  assert.deepEqual(p.handle(testing.record({ value: 'abcd' })), reject('4 bytes > 3'));
  assert.deepEqual(p.handle(testing.record({ value: null })), reject('tombstone'));
});
