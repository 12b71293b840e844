// The seam between the SDK and whatever plays the host: the real one inside a component
// (src/component.js installs it), or a fake under `node --test` (src/testing.js controls it).
// Kept apart so the SDK's pure code never imports a `sharehost:plugin/*` module, which
// exists only inside a component.

import { EmitError } from './errors.js';

/**
 * @typedef {'trace' | 'debug' | 'info' | 'warn' | 'error'} Level
 *
 * @typedef {{key: string, value: Uint8Array | null}} WireHeader
 *
 * @typedef {object} HostBackend
 * @property {(level: Level, message: string) => void} log
 *   Writes one line to the host's log.
 * @property {(recordIndex: number, output: string, key: Uint8Array | null,
 *   value: Uint8Array | null, headers: WireHeader[]) => void} emit
 *   Emits one record bound to record `recordIndex` of the batch being judged; throws an
 *   `EmitError` when refused.
 */

/** @type {HostBackend | null} */
let backend = null;

/**
 * Installs the host backend. Called once by the component glue, and by `testing.reset()`.
 * Why a setter: the same SDK code runs natively (tests) and in a component.
 * @param {HostBackend} b
 */
export function setBackend(b) {
  backend = b;
}

/**
 * The installed backend; natively, when nothing was installed, a `FakeHost` that echoes
 * log lines to stderr (so a plugin's logs show up in a test run).
 * @returns {HostBackend}
 */
export function getBackend() {
  if (backend === null) backend = new FakeHost({ echo: true });
  return backend;
}

/** The header-key prefix the host keeps for its own (provenance) headers. */
export const RESERVED_HEADER_PREFIX = 'sharehost.';

/**
 * A stand-in for the host under `node --test`: collects log lines and emits, refuses what the
 * real host refuses (reserved header prefix) and whatever a test's policy refuses. Why: a
 * plugin's unit tests then exercise its emit and error paths without a component.
 */
export class FakeHost {
  /** @param {{echo?: boolean}} [options] echo: also write log lines to stderr. */
  constructor(options = {}) {
    this.echo = options.echo ?? false;
    /** @type {Array<{level: Level, message: string}>} */
    this.logs = [];
    /** @type {Array<{recordIndex: number, output: string, key: Uint8Array | null, value: Uint8Array | null, headers: WireHeader[]}>} */
    this.emits = [];
    /** @type {((emit: any) => (Error | null | undefined)) | null} */
    this.policy = null;
  }

  /** Records the line (and echoes it to stderr when asked). */
  log(level, message) {
    this.logs.push({ level, message });
    if (this.echo) globalThis.process?.stderr?.write(`[${level.toUpperCase()}] ${message}\n`);
  }

  /** Records the emit, or throws what the host (or the test's policy) would refuse with. */
  emit(recordIndex, output, key, value, headers) {
    for (const h of headers) {
      if (h.key.startsWith(RESERVED_HEADER_PREFIX)) throw new EmitError('reserved-header', h.key);
    }
    const emit = {
      recordIndex,
      output,
      key: key === null ? null : Uint8Array.from(key),
      value: value === null ? null : Uint8Array.from(value),
      headers: headers.map((h) => ({ key: h.key, value: h.value === null ? null : Uint8Array.from(h.value) })),
    };
    const refused = this.policy?.(emit);
    if (refused) throw refused;
    this.emits.push(emit);
  }
}
