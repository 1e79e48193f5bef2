// Builds the Live code editor bundle (see README.md): node build.mjs BUNDLE LICENSE
import { build } from "esbuild";
import { readFileSync, readdirSync, writeFileSync } from "node:fs";

const [bundle = "live_editor.js", license = "LICENSE.txt"] = process.argv.slice(2);
const options = { entryPoints: ["entry.js"], bundle: true, minify: true, format: "iife", target: "es2020",
                  globalName: "attentionRefEditor", legalComments: "none" };
// First pass: the packages the bundle is built from, to name them with their versions and licenses.
const probe = await build({ ...options, write: false, metafile: true });
const packages = [...new Set(Object.keys(probe.metafile.inputs)
  .map((path) => path.match(/node_modules\/((?:@[^/]+\/)?[^/]+)\//)?.[1]).filter(Boolean))].sort();
const found = packages.map((name) => {
  const meta = JSON.parse(readFileSync(`node_modules/${name}/package.json`, "utf8"));
  const file = readdirSync(`node_modules/${name}`).find((f) => /^licen[cs]e/i.test(f));
  const text = readFileSync(`node_modules/${name}/${file}`, "utf8").trim();
  if (meta.license !== "MIT" || !text.includes("Permission is hereby granted")) throw new Error(`${name}: not MIT`);
  return { name, version: meta.version, text, copyright: text.split("\n").find((l) => /copyright/i.test(l)).trim() };
});
const permission = found[0].text.slice(found[0].text.indexOf("Permission is hereby granted"));
const esbuildVersion = JSON.parse(readFileSync("node_modules/esbuild/package.json", "utf8")).version;
const banner = [
  `/* The Live code editor of attention_ref's book: CodeMirror 6 with the Python grammar, built by esbuild`,
  ` * ${esbuildVersion} from vendor/live_editor/entry.js (vendor/live_editor/README.md says how). Built from these`,
  ` * packages, each under the MIT License:`,
  ...found.map((p) => ` *   ${p.name} ${p.version}: ${p.copyright}`),
  ` *`,
  ...permission.split("\n").map((line) => ` * ${line}`.trimEnd()),
  ` */`,
].join("\n");
await build({ ...options, banner: { js: banner }, outfile: bundle });
writeFileSync(license, found.map((p) => `${p.name} ${p.version}\n\n${p.text}\n`).join("\n" + "-".repeat(78) + "\n\n"));
console.log(`${bundle}: ${found.map((p) => `${p.name}@${p.version}`).join(", ")}`);
