#!/usr/bin/env node
// Validates rendered Kubernetes objects against the Kubernetes OpenAPI schemas (npm
// kubernetes-models) and the Prometheus operator's CRDs (@kubernetes-models/prometheus-operator).
// Reads a multi-document YAML file; prints one line per object; exit 1 when any object is invalid or
// of a kind this script does not know (a new kind must be added here, not skipped).
//
// usage: node validate_k8s.mjs RENDERED.yaml    (node_modules from tests/conformance: npm ci there)
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const MODULES = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'conformance', 'node_modules');
const load = (m) => import(path.join(MODULES, m));
const { parseAllDocuments } = await load('yaml/dist/index.js');
const models = {
  'v1': await load('kubernetes-models/v1/index.mjs'),
  'apps/v1': await load('kubernetes-models/apps/v1/index.mjs'),
  'policy/v1': await load('kubernetes-models/policy/v1/index.mjs'),
  'autoscaling/v2': await load('kubernetes-models/autoscaling/v2/index.mjs'),
  'networking.k8s.io/v1': await load('kubernetes-models/networking.k8s.io/v1/index.mjs'),
  'monitoring.coreos.com/v1': await load('@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/index.mjs'),
};

const file = process.argv[2];
let bad = 0;
for (const doc of parseAllDocuments(fs.readFileSync(file, 'utf8'))) {
  const obj = doc.toJS();
  if (!obj) continue;
  const what = `${obj.apiVersion} ${obj.kind} ${obj.metadata?.name}`;
  const Model = models[obj.apiVersion]?.[obj.kind];
  if (!Model) {
    console.log(`UNKNOWN ${what}: no schema for this kind here`);
    ++bad;
    continue;
  }
  try {
    new Model(obj).validate();
    console.log(`valid ${what}`);
  } catch (e) {
    console.log(`INVALID ${what}: ${e.message}`);
    ++bad;
  }
}
process.exit(bad ? 1 : 0);
