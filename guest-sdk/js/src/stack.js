// Where an error was thrown, in the plugin's own files. Inside a component the engine's stack
// points into the one bundled file the build made; the build appends a table from each bundle
// line to its source file and line (from esbuild's source map), and this module reads stacks
// through it. Pure, so it is unit-tested natively.

/**
 * The table the build appends to a bundle (`globalThis.__sharehostSourceLines`): `files`, and
 * per bundle line (1-based: entry `n - 1`) `[fileIndex, line]` of the source it came from, or
 * `null` for a line of the build's own.
 * @typedef {{files: string[], lines: Array<[number, number] | null>}} SourceLines
 */

/** The bundle's table, when the build appended one. */
function table() {
  const t = globalThis.__sharehostSourceLines;
  return t && Array.isArray(t.files) && Array.isArray(t.lines) ? t : null;
}

/** A frame of a SpiderMonkey (`fn@file:line:col`) or V8 (`at fn (file:line:col)`) stack. */
const FRAME = /^\s*(?:at\s+)?(?:(.*?)@|(?:(.*?)\s+\()?)(.*?):(\d+):(\d+)\)?\s*$/;

/**
 * One stack frame mapped to the plugin's source: `{fn, file, line}`, or `null` when the line
 * is not a frame.
 * @param {string} text
 * @param {SourceLines | null} [lines]
 */
export function mapFrame(text, lines = table()) {
  const m = FRAME.exec(text);
  if (!m) return null;
  const fn = m[1] ?? m[2] ?? '';
  let file = m[3];
  let line = Number(m[4]);
  const entry = lines?.lines[line - 1];
  if (entry) {
    file = lines.files[entry[0]] ?? file;
    line = entry[1];
  }
  return { fn, file, line };
}

/**
 * The error's stack with every frame of the bundle replaced by its source file and line (as
 * it is when there is no table: natively, the stack already names the sources).
 * @param {string} stack
 * @param {SourceLines | null} [lines]
 */
export function mapStack(stack, lines = table()) {
  if (!lines) return stack;
  return stack
    .split('\n')
    .map((text) => {
      const f = mapFrame(text, lines);
      return f ? `${f.fn || '(anonymous)'}@${f.file}:${f.line}` : text;
    })
    .join('\n');
}

/**
 * Where `error` was thrown: the innermost frame of the plugin's own files (not the SDK's), as
 * `file:line in fn`, or `''` when its stack says nothing.
 * @param {unknown} error
 * @param {SourceLines | null} [lines]
 */
export function where(error, lines = table()) {
  const stack = error instanceof Error && typeof error.stack === 'string' ? error.stack : '';
  const frames = stack.split('\n').map((t) => mapFrame(t, lines)).filter((f) => f !== null);
  const own = frames.find((f) => !/(^|\/)(guest-sdk\/js|@sharehost\/guest)\/src\//.test(f.file) && !f.file.startsWith('node:'));
  const f = own ?? frames[0];
  if (!f) return '';
  return `${f.file}:${f.line}${f.fn ? ` in ${f.fn}` : ''}`;
}
