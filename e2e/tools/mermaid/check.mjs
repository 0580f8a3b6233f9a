// Parse each file given with the real Mermaid (in jsdom, as a browser would load it); exit 1
// with Mermaid's own error on the first it refuses. Prints "<file>: <diagram type>" per file.
import { readFileSync } from 'node:fs';
import { JSDOM } from 'jsdom';

const dom = new JSDOM('<!doctype html><html><body></body></html>');
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import('mermaid');

for (const file of process.argv.slice(2)) {
  try {
    const parsed = await mermaid.parse(readFileSync(file, 'utf8'));
    console.log(`${file}: ${parsed.diagramType}`);
  } catch (e) {
    console.error(`${file}: Mermaid refuses it: ${e.message}`);
    process.exit(1);
  }
}
