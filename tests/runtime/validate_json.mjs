// Validates generated JSON documents against their schemas with ajv (JSON Schema 2020-12).
// Usage: node validate_json.mjs FILE, FILE = {"schemas": [...], "outputs": [{"schema": i, "text": "..."}]}.
// Prints "N valid, M invalid" and exits 1 when any output does not parse or does not validate.
import { createRequire } from "node:module";
import fs from "node:fs";

const require = createRequire(new URL("../server/package.json", import.meta.url));
const Ajv2020 = require("ajv/dist/2020").default;
const data = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const ajv = new Ajv2020({ strict: false, allErrors: true });
const validators = data.schemas.map((s) => ajv.compile(s));
let bad = 0;
for (const o of data.outputs) {
  let v;
  try {
    v = JSON.parse(o.text);
  } catch (e) {
    console.error(`schema ${o.schema}: not JSON (${e.message}): ${JSON.stringify(o.text)}`);
    bad++;
    continue;
  }
  if (!validators[o.schema](v)) {
    console.error(`schema ${o.schema}: ${ajv.errorsText(validators[o.schema].errors)}: ${o.text}`);
    bad++;
  }
}
console.log(`${data.outputs.length - bad} valid, ${bad} invalid`);
process.exit(bad ? 1 : 0);
