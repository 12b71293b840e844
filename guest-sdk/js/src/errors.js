/**
 * Why the host refused an emit (the contract's `emit-error`). Nothing is dropped silently:
 * a refused emit is not produced, and the plugin decides what that means for its record
 * (usually `release()`, or `reject(err.message)`).
 *
 * `kind` is one of `'no-such-record'`, `'unknown-output'`, `'too-many-emits'`,
 * `'too-many-bytes'`, `'reserved-header'`; `detail` carries the output name, the limit or
 * the header key (undefined for `'no-such-record'`).
 */
export class EmitError extends Error {
  /**
   * @param {'no-such-record' | 'unknown-output' | 'too-many-emits' | 'too-many-bytes' | 'reserved-header'} kind
   * @param {string | number} [detail]
   */
  constructor(kind, detail) {
    super(emitErrorMessage(kind, detail));
    this.name = 'EmitError';
    /** Which refusal (the WIT `emit-error` case name). */
    this.kind = kind;
    /** The output name, the manifest limit or the header key, per `kind`. */
    this.detail = detail;
  }
}

/** The same wording as the Rust SDK's `EmitError` Display, so logs read alike. */
function emitErrorMessage(kind, detail) {
  switch (kind) {
    case 'no-such-record':
      return 'emit refused: no such record in the batch being judged';
    case 'unknown-output':
      return `emit refused: unknown output \`${detail}\` (not in the manifest's [pipeline.outputs], or test-plugin's --output)`;
    case 'too-many-emits':
      return `emit refused: too many emits: the batch already emitted ${detail}, the manifest's max_emits_per_batch`;
    case 'too-many-bytes':
      return `emit refused: too many bytes: this emit would take the batch past ${detail} bytes (max_emit_bytes_per_batch)`;
    case 'reserved-header':
      return `emit refused: header \`${detail}\` uses the reserved \`sharehost.\` prefix`;
    default:
      return `emit refused: ${kind}${detail === undefined ? '' : ` (${detail})`}`;
  }
}
