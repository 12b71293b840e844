// {{name}}: a sharehost plugin. It rejects tombstones and values larger than `max-bytes`
// (plugin config, default 1024) and accepts the rest. Change `handle` to judge your records.
import { Plugin, accept, reject } from '@sharehost/guest';

export default class {{type}} extends Plugin {
  init(config) {
    this.max = Number.parseInt(config.get('max-bytes', '1024'), 10);
    if (!Number.isSafeInteger(this.max)) throw new Error('max-bytes: not an integer');
  }

  handle(record) {
    if (record.value === null) return reject('tombstone');
    if (record.value.length > this.max) {
      console.log(`offset ${record.offset}: ${record.value.length} B`);
      return reject(`${record.value.length} bytes > ${this.max}`);
    }
    return accept();
  }
}
