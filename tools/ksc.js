#!/usr/bin/env node
// Compile the project's .ksy schemas with the Kaitai Struct compiler's JavaScript API
// (the npm package kaitai-struct-compiler has no command line of its own).
//
//   node tools/ksc.js MODULES KSY_DIR [--debug] LANG... < /dev/null
//
// MODULES is the node_modules folder holding kaitai-struct-compiler and js-yaml (.ci/run
// installs them into .ci/node_modules); every KSY_DIR/*.ksy is compiled for every LANG,
// imports resolved from KSY_DIR.  Prints one JSON object on stdout:
//   {"LANG": {"NAME.ksy": {"GeneratedFile": "source", ...}, ...}, ...}
// and on a failure prints the compiler's message on stderr and exits 1.  The compiler is
// a development tool (GPL-3.0): it is never installed with the package.
"use strict";

const fs = require("fs");
const path = require("path");

function main(argv) {
  const [modules, ksyDir, ...rest] = argv;
  if (!modules || !ksyDir) {
    process.stderr.write("usage: node tools/ksc.js MODULES KSY_DIR [--debug] LANG...\n");
    process.exit(2);
  }
  const debug = rest.includes("--debug");
  const languages = rest.filter((arg) => arg !== "--debug");
  const compiler = require(path.resolve(modules, "kaitai-struct-compiler"));
  const yaml = require(path.resolve(modules, "js-yaml"));
  const load = (file) => yaml.load(fs.readFileSync(file, "utf8"));
  const importer = {
    importYaml: (name) => Promise.resolve(load(path.join(ksyDir, name + ".ksy"))),
  };
  const schemas = fs.readdirSync(ksyDir).filter((name) => name.endsWith(".ksy")).sort();
  const jobs = [];
  const out = {};
  for (const lang of languages) {
    out[lang] = {};
    for (const name of schemas) {
      jobs.push(
        compiler.compile(lang, load(path.join(ksyDir, name)), importer, debug).then(
          (files) => { out[lang][name] = files; },
          (error) => { throw new Error(`${lang} ${name}: ${error && error.stack ? error.stack : error}`); },
        ),
      );
    }
  }
  Promise.all(jobs).then(
    () => process.stdout.write(JSON.stringify(out)),
    (error) => { process.stderr.write(String(error.message || error) + "\n"); process.exit(1); },
  );
}

main(process.argv.slice(2));
