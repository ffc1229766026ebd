// Renders every overlay of deploy/k8s (and each overlay with each component) with
// `kubectl kustomize`, validates every object against the Kubernetes schemas offline
// (kubernetes-models, @kubernetes-models/prometheus-operator), and applies moetrain's own rules.
// Then it breaks a copy of the manifests in the ways an operator could, one at a time, and checks
// that the rules catch each.
//
//   node validate.js DEPLOY_K8S_DIR
//
// Exit 0: all valid; 1: a finding (each printed); 77: kubectl or its kustomize is missing or too
// old (ctest's skip).
'use strict';

const childProcess = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const YAML = require('yaml');

const NAMESPACE = 'moetrain';
// The users' token (the coordinator's --token-file) and the workers' (--worker-token-file, which
// alone registers workers): each in a Secret of its own, mounted where it is needed.
const TOKEN_SECRET = 'moetrain-token';
const TOKEN_MOUNT = '/etc/moetrain/token';
const WORKER_TOKEN_SECRET = 'moetrain-worker-token';
const WORKER_TOKEN_MOUNT = '/etc/moetrain/worker-token';

// --- Rendering ---------------------------------------------------------------------------------

function kustomizeVersion() {
  let out;
  try {
    out = childProcess.execFileSync(
        'kubectl', ['version', '--client', '-o', 'json'],
        {encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe']});
  } catch (error) {
    return {
      error: error.code === 'ENOENT' ? 'kubectl is not installed' :
                                       `kubectl version failed: ${error.message}`
    };
  }
  const version = JSON.parse(out).kustomizeVersion;
  // kubectl before 1.21 carries kustomize v2 and does not say so here.
  if (!version) return {error: 'this kubectl does not report a kustomize version (kubectl < 1.21)'};
  const major = Number(/^v?(\d+)/.exec(version)?.[1]);
  if (!(major >= 4))
    return {error: `kubectl's kustomize is ${version}; components need v4 or later`};
  return {version};
}

// The objects `kubectl kustomize dir` renders, or throws with kustomize's message.
function render(dir) {
  const result = childProcess.spawnSync('kubectl', ['kustomize', dir], {encoding: 'utf8'});
  if (result.status !== 0) {
    throw new Error(`kubectl kustomize ${dir} failed: ${result.stderr.trim()}`);
  }
  const objects = [];
  for (const doc of YAML.parseAllDocuments(result.stdout)) {
    if (doc.errors.length > 0) throw new Error(`${dir}: YAML: ${doc.errors[0].message}`);
    const object = doc.toJS();
    if (object !== null) objects.push(object);
  }
  return objects;
}

// What the test renders: each overlay alone, and each overlay with each component, through a
// temporary kustomization (kustomize wants relative paths to them).
function targets(root, scratch) {
  const list = (sub) => fs.readdirSync(path.join(root, sub), {withFileTypes: true})
                            .filter((entry) => entry.isDirectory())
                            .map((entry) => entry.name)
                            .sort();
  const overlays = list('overlays');
  const components = fs.existsSync(path.join(root, 'components')) ? list('components') : [];
  const out =
      overlays.map((name) => ({name, overlay: name, dir: path.join(root, 'overlays', name)}));
  for (const overlay of overlays) {
    for (const component of components) {
      const dir = path.join(scratch, `${overlay}+${component}`);
      fs.mkdirSync(dir, {recursive: true});
      const rel = (p) => path.relative(dir, path.join(root, p));
      fs.writeFileSync(path.join(dir, 'kustomization.yaml'), YAML.stringify({
        apiVersion: 'kustomize.config.k8s.io/v1beta1',
        kind: 'Kustomization',
        resources: [rel(`overlays/${overlay}`)],
        components: [rel(`components/${component}`)],
      }));
      out.push({name: `${overlay}+${component}`, overlay, dir});
    }
  }
  return out;
}

// --- Schemas -----------------------------------------------------------------------------------

// The kubernetes-models class of an object: `apps/v1` → kubernetes-models/apps/v1; the core group
// `v1` → kubernetes-models/v1; the Prometheus Operator's group → its own package.
function modelClass(apiVersion, kind) {
  const modules = apiVersion.startsWith('monitoring.coreos.com/') ?
      [`@kubernetes-models/prometheus-operator/${apiVersion}`] :
      [`kubernetes-models/${apiVersion}`];
  for (const name of modules) {
    try {
      const model = require(name)[kind];
      if (model) return model;
    } catch (error) {
      if (error.code !== 'MODULE_NOT_FOUND') throw error;
    }
  }
  return null;
}

function validateSchema(object, report) {
  const Model = modelClass(object.apiVersion || '', object.kind || '');
  if (!Model) {
    report(`no schema for apiVersion ${object.apiVersion}, kind ${object.kind}`);
    return;
  }
  try {
    new Model(object).validate();
  } catch (error) {
    report(`schema: ${error.message}`);
  }
}

// --- moetrain's rules --------------------------------------------------------------------------

const WORKLOADS = new Set(['Deployment', 'StatefulSet', 'DaemonSet', 'Job']);

function containersOf(podSpec) {
  return [...(podSpec.initContainers || []), ...(podSpec.containers || [])];
}

function labelsMatch(selector, labels) {
  const entries = Object.entries(selector || {});
  return entries.length > 0 && entries.every(([k, v]) => (labels || {})[k] === v);
}

// A port reference (a probe's or a Service's targetPort) names or numbers a container port.
function portExists(container, port) {
  return (container.ports || []).some((p) => p.name === port || p.containerPort === port);
}

// `--flag=value` from a container's args (the last one wins, as in the binaries).
function flagValue(container, flag) {
  let value;
  for (const arg of [...(container.command || []), ...(container.args || [])]) {
    if (arg.startsWith(`${flag}=`)) value = arg.slice(flag.length + 1);
  }
  return value;
}

// The container's environment as the kubelet builds it: envFrom ConfigMaps, then env.
function environment(container, configMaps) {
  const env = new Map();
  for (const source of container.envFrom || []) {
    if (source.configMapRef) {
      const map = configMaps.get(source.configMapRef.name);
      for (const [key, value] of Object.entries(map?.data || {})) {
        env.set(`${source.prefix || ''}${key}`, value);
      }
    }
  }
  for (const variable of container.env || []) {
    env.set(
        variable.name, variable.value !== undefined ? variable.value : {from: variable.valueFrom});
  }
  return env;
}

// $(VAR) expanded as the kubelet does it; undefined when a reference cannot be resolved.
function expand(text, env) {
  let ok = true;
  const out = text.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (match, name) => {
    const value = env.get(name);
    if (value === undefined) ok = false;
    return typeof value === 'string' ? value : match;
  });
  return ok ? out : undefined;
}

function cpuCores(quantity) {
  if (quantity === undefined) return undefined;
  const text = String(quantity);
  return text.endsWith('m') ? Number(text.slice(0, -1)) / 1000 : Number(text);
}

// What every rule below sees: the rendered objects by kind and name, and where findings go.
function context(target, objects, findings) {
  const byKind = (kind) => objects.filter((o) => o.kind === kind);
  return {
    objects,
    byKind,
    gpu: target.overlay === 'gpu',
    configMaps: new Map(byKind('ConfigMap').map((o) => [o.metadata.name, o])),
    claims: new Map(byKind('PersistentVolumeClaim').map((o) => [o.metadata.name, o])),
    services: byKind('Service'),
    workloads: objects.filter((o) => WORKLOADS.has(o.kind)),
    report: (object, message) =>
        findings.push(`${target.name}: ${object.kind}/${object.metadata?.name}: ${message}`),
    reportTarget: (message) => findings.push(`${target.name}: ${message}`),
  };
}

const component = (object) => object.metadata?.labels?.['app.kubernetes.io/component'];

function mountsAt(container, mountPath) {
  return (container.volumeMounts || []).some((m) => m.mountPath === mountPath);
}

// The persistent volume claim behind a path of a container, if any.
function claimAt(ctx, workload, container, file) {
  const mount = (container.volumeMounts ||
                 []).find((m) => file === m.mountPath || file?.startsWith(`${m.mountPath}/`));
  const volume = (workload.spec.template.spec.volumes || []).find((v) => v.name === mount?.name);
  return ctx.claims.get(volume?.persistentVolumeClaim?.claimName);
}

function checkObjects(ctx) {
  for (const object of ctx.objects) {
    if (object.kind !== 'Namespace' && object.metadata?.namespace !== NAMESPACE) {
      ctx.report(object, `namespace is '${object.metadata?.namespace}', not '${NAMESPACE}'`);
    }
    // The token is created by the operator (docs/deploy.md), never committed.
    if (object.kind === 'Secret' && (object.data || object.stringData)) {
      ctx.report(
          object, 'a Secret with data in the manifests: create the token Secret out of band');
    }
  }
}

// Every container: a pinned image, resources, the security settings, defined variables, probes
// on its own ports, volumes that exist.
function checkContainer(ctx, workload, container, volumes) {
  const report = (message) => ctx.report(workload, `container ${container.name}: ${message}`);
  const image = container.image || '';
  const tag = /^(?:.*\/)?[^/:@]+(?::([^/@]+))?(?:@sha256:[0-9a-f]{64})?$/.exec(image)?.[1];
  if (!tag && !image.includes('@sha256:')) report(`image '${image}' has no tag`);
  if (tag === 'latest') report(`image '${image}' uses the tag latest`);
  const resources = container.resources || {};
  for (const [kind, name] of [['requests', 'cpu'], ['requests', 'memory'], ['limits', 'memory']]) {
    if (resources[kind]?.[name] === undefined) report(`no resources.${kind}.${name}`);
  }
  const security = container.securityContext || {};
  if (security.allowPrivilegeEscalation !== false) report('allowPrivilegeEscalation is not false');
  if (security.readOnlyRootFilesystem !== true) report('readOnlyRootFilesystem is not true');
  if (!(security.capabilities?.drop || []).includes('ALL')) report('capabilities do not drop ALL');
  for (const source of container.envFrom || []) {
    if (source.configMapRef && !ctx.configMaps.has(source.configMapRef.name)) {
      report(`envFrom ConfigMap ${source.configMapRef.name} is not rendered`);
    }
  }
  for (const mount of container.volumeMounts || []) {
    if (!volumes.has(mount.name)) report(`volumeMount ${mount.name} has no volume`);
  }
  const env = environment(container, ctx.configMaps);
  for (const arg of [...(container.command || []), ...(container.args || [])]) {
    if (expand(arg, env) === undefined) report(`'${arg}' refers to an undefined variable`);
  }
  for (const kind of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
    const probe = container[kind];
    const port = probe?.grpc?.port ?? probe?.httpGet?.port ?? probe?.tcpSocket?.port;
    if (port !== undefined && !portExists(container, port)) {
      report(`${kind} port ${port} is not a container port`);
    }
  }
}

// A worker: in the gpu overlay, --devices=cuda (every GPU the pod is given) or a list of as many
// GPUs as its nvidia.com/gpu limit; NVIDIA_VISIBLE_DEVICES left to the device plugin, and the
// driver's compute libraries asked for. Threads within the CPU limit. Its metrics served on the pod
// network, on the container port `metrics`, which a Service of the workers lists.
function checkWorker(ctx, workload, container) {
  const report = (message) => ctx.report(workload, `container ${container.name}: ${message}`);
  const pod = workload.spec.template.spec;
  const env = environment(container, ctx.configMaps);
  const limits = container.resources?.limits || {};
  const gpus = limits['nvidia.com/gpu'];
  const devices = expand(flagValue(container, '--devices') || '', env);
  if (ctx.gpu) {
    if (!(Number(gpus) >= 1)) report('no nvidia.com/gpu limit in the gpu overlay');
    if (devices === 'cuda') {
      // The worker takes every GPU it can see, which are those of the limit.
    } else if (devices?.startsWith('cuda:')) {
      const listed = devices.slice(5).split(',').length;
      if (listed !== Number(gpus)) {
        report(`--devices=${devices} lists ${listed} GPUs, the limit is ${gpus}`);
      }
    } else {
      report(`--devices=${devices} in the gpu overlay: the workers would not use their GPUs`);
    }
    const requested = container.resources?.requests?.['nvidia.com/gpu'];
    if (requested !== undefined && String(requested) !== String(gpus)) {
      report(`nvidia.com/gpu request ${requested} differs from the limit ${gpus}`);
    }
    // The device plugin sets NVIDIA_VISIBLE_DEVICES to the GPUs it allocated; a value in the pod
    // spec would override that and could hand the worker GPUs allocated to other pods.
    if (env.has('NVIDIA_VISIBLE_DEVICES')) {
      report('sets NVIDIA_VISIBLE_DEVICES, which the NVIDIA device plugin must set');
    }
    const capabilities = env.get('NVIDIA_DRIVER_CAPABILITIES');
    if (typeof capabilities === 'string' && capabilities !== 'all' &&
        !capabilities.split(',').includes('compute')) {
      report(`NVIDIA_DRIVER_CAPABILITIES=${capabilities} lacks compute (libcuda)`);
    }
    if (!pod.tolerations?.length && !pod.nodeSelector && !pod.affinity) {
      report('GPU workers have no node selector, affinity or tolerations');
    }
  } else if (devices !== 'cpu' || gpus !== undefined) {
    report(`a CPU overlay with --devices=${devices} and nvidia.com/gpu=${gpus}`);
  }
  const threads = Number(expand(flagValue(container, '--threads') || '', env));
  const cores = cpuCores(limits.cpu ?? container.resources?.requests?.cpu);
  if (!(threads >= 1) || (cores !== undefined && threads > Math.ceil(cores))) {
    report(`--threads=${threads} with a CPU limit of ${cores} cores`);
  }
  const poolThreads = env.get('MOETRAIN_NUM_THREADS');
  if (poolThreads !== undefined && Number(poolThreads) !== threads) {
    report('MOETRAIN_NUM_THREADS and --threads differ');
  }
  const metricsListen = expand(flagValue(container, '--metrics-listen') || '', env);
  if (!metricsListen) {
    report('no --metrics-listen: Prometheus cannot scrape the worker');
    return;
  }
  const colon = metricsListen.lastIndexOf(':');
  const host = metricsListen.slice(0, colon);
  const port = Number(metricsListen.slice(colon + 1));
  if (host === 'localhost' || host.startsWith('127.') || host === '[::1]') {
    report(`--metrics-listen=${metricsListen} listens on loopback only: Prometheus cannot reach it`);
  }
  const named = (container.ports || []).find((p) => p.name === 'metrics');
  if (named?.containerPort !== port) {
    report(`--metrics-listen=${metricsListen} is not the container port metrics ` +
           `(${named?.containerPort})`);
  }
  const labels = workload.spec.template.metadata.labels;
  if (!ctx.services.some((s) => labelsMatch(s.spec.selector, labels) &&
                             (s.spec.ports || []).some((p) => p.targetPort === 'metrics'))) {
    report('no Service lists the worker port metrics');
  }
}

function checkWorkloads(ctx) {
  for (const workload of ctx.workloads) {
    const template = workload.spec.template;
    const pod = template.spec;
    if (!labelsMatch(workload.spec.selector?.matchLabels, template.metadata?.labels)) {
      ctx.report(workload, 'spec.selector.matchLabels does not match the pod template labels');
    }
    if (pod.securityContext?.runAsNonRoot !== true) {
      ctx.report(workload, 'pod securityContext.runAsNonRoot is not true');
    }
    const volumes = new Map((pod.volumes || []).map((v) => [v.name, v]));
    for (const volume of volumes.values()) {
      const claim = volume.persistentVolumeClaim?.claimName;
      if (claim !== undefined && !ctx.claims.has(claim)) {
        ctx.report(workload, `volume ${volume.name}: claim ${claim} is not rendered`);
      }
      const secret = volume.secret?.secretName;
      if (secret !== undefined && secret !== TOKEN_SECRET && secret !== WORKER_TOKEN_SECRET) {
        ctx.report(workload, `volume ${volume.name}: Secret ${secret} is not documented`);
      }
    }
    for (const container of containersOf(pod)) {
      checkContainer(ctx, workload, container, volumes);
      if (component(workload) === 'worker') checkWorker(ctx, workload, container);
    }
  }
}

// The coordinator: one pod that owns the state file, probed on gRPC health, reached through its
// Service by the workers, which share its checkpoint root.
function checkCoordinator(ctx) {
  const coordinators = ctx.workloads.filter((o) => component(o) === 'coordinator');
  if (coordinators.length !== 1) {
    ctx.reportTarget(`${coordinators.length} coordinator workloads, not 1`);
    return;
  }
  const coordinator = coordinators[0];
  const report = (message) => ctx.report(coordinator, message);
  if (coordinator.kind !== 'Deployment') report('the coordinator is not a Deployment');
  if (coordinator.spec.replicas !== 1) {
    report(`replicas is ${coordinator.spec.replicas}, not 1 (one coordinator per state file)`);
  }
  if (coordinator.spec.strategy?.type !== 'Recreate') {
    report('strategy is not Recreate (the new pod would wait on the state file lock)');
  }
  const container = coordinator.spec.template.spec.containers[0];
  const ports = container.ports || [];
  for (const name of ['grpc', 'http']) {
    if (!ports.some((p) => p.name === name)) report(`no container port named ${name}`);
  }
  const grpcPort = ports.find((p) => p.name === 'grpc')?.containerPort;
  for (const kind of ['readinessProbe', 'livenessProbe']) {
    if (container[kind]?.grpc?.port !== grpcPort)
      report(`${kind} is not a gRPC probe of port grpc`);
  }
  const stateDb = flagValue(container, '--state-db');
  const stateClaim = claimAt(ctx, coordinator, container, stateDb);
  if (!stateClaim) {
    report(`--state-db=${stateDb} is not on a persistent volume claim`);
  } else if (!(stateClaim.spec.accessModes || []).includes('ReadWriteOnce')) {
    report('the state claim is not ReadWriteOnce');
  }
  const tokenFile = flagValue(container, '--token-file');
  if (!tokenFile?.startsWith(`${TOKEN_MOUNT}/`) || !mountsAt(container, TOKEN_MOUNT)) {
    report(`--token-file=${tokenFile} is not in the mounted token Secret`);
  }
  // Without it, anyone with the users' token could register a worker and be given other users'
  // ranks.
  const workerTokenFile = flagValue(container, '--worker-token-file');
  if (!workerTokenFile?.startsWith(`${WORKER_TOKEN_MOUNT}/`) ||
      !mountsAt(container, WORKER_TOKEN_MOUNT)) {
    report(`--worker-token-file=${workerTokenFile} is not in the mounted worker token Secret`);
  }
  const labels = coordinator.spec.template.metadata.labels;
  const service =
      ctx.services.find((s) => s.spec.clusterIP !== 'None' && labelsMatch(s.spec.selector, labels));
  if (!service) {
    report('no Service selects the coordinator');
    return;
  }
  for (const name of ['grpc', 'http']) {
    const port = service.spec.ports.find((p) => p.name === name);
    if (!port || port.targetPort !== name) {
      ctx.report(service, `port ${name} does not target the container port ${name}`);
    }
  }
  const address =
      `${service.metadata.name}:${service.spec.ports.find((p) => p.name === 'grpc')?.port}`;
  const checkpointDir = flagValue(container, '--checkpoint-dir');
  for (const worker of ctx.workloads.filter((o) => o !== coordinator)) {
    for (const workerContainer of worker.spec.template.spec.containers) {
      const env = environment(workerContainer, ctx.configMaps);
      const dials = flagValue(workerContainer, '--coordinator') ?? env.get('MOETRAIN_COORDINATOR');
      if (dials !== address) {
        ctx.report(worker, `the coordinator address ${dials} is not its Service's grpc port`);
      }
      const token = flagValue(workerContainer, '--worker-token-file') ??
          env.get('MOETRAIN_WORKER_TOKEN_FILE');
      if (!String(token).startsWith(`${WORKER_TOKEN_MOUNT}/`) ||
          !mountsAt(workerContainer, WORKER_TOKEN_MOUNT)) {
        ctx.report(
            worker, `the worker token file ${token} is not in the mounted worker token Secret`);
      }
      if (mountsAt(workerContainer, TOKEN_MOUNT)) {
        ctx.report(worker, 'mounts the users\' token Secret, which a worker does not use');
      }
      const claim = claimAt(ctx, worker, workerContainer, checkpointDir);
      if (!claim) {
        ctx.report(
            worker,
            `the coordinator's --checkpoint-dir=${checkpointDir} is not a persistent volume here`);
      } else if (ctx.gpu && !(claim.spec.accessModes || []).includes('ReadWriteMany')) {
        ctx.report(claim, 'workers on several nodes share it, but it is not ReadWriteMany');
      }
    }
  }
}

// Services select pods and target their ports; StatefulSets have a headless governing Service;
// ServiceMonitors select Services and scrape ports they have.
function checkServices(ctx) {
  for (const service of ctx.services) {
    const selected = ctx.workloads.filter(
        (w) => labelsMatch(service.spec.selector, w.spec.template.metadata.labels));
    if (selected.length === 0) {
      ctx.report(service, 'its selector matches no pod template');
      continue;
    }
    for (const port of service.spec.ports || []) {
      const target = port.targetPort ?? port.port;
      for (const workload of selected) {
        if (!workload.spec.template.spec.containers.some((c) => portExists(c, target))) {
          ctx.report(
              service,
              `port ${port.name}: targetPort ${target} is not a port of ${workload.metadata.name}`);
        }
      }
    }
  }
  for (const set of ctx.byKind('StatefulSet')) {
    const governing = ctx.services.find((s) => s.metadata.name === set.spec.serviceName);
    if (!governing || governing.spec.clusterIP !== 'None') {
      ctx.report(set, `serviceName ${set.spec.serviceName} is not a headless Service`);
    }
  }
  for (const monitor of ctx.byKind('ServiceMonitor')) {
    const matched = ctx.services.filter(
        (s) => labelsMatch(monitor.spec.selector?.matchLabels, s.metadata.labels));
    if (matched.length === 0) ctx.report(monitor, 'its selector matches no Service');
    for (const endpoint of monitor.spec.endpoints || []) {
      if (!matched.every((s) => (s.spec.ports || []).some((p) => p.name === endpoint.port))) {
        ctx.report(
            monitor, `endpoint port ${endpoint.port} is not a port of the Services it selects`);
      }
    }
  }
}

function checkRules(target, objects, findings) {
  const ctx = context(target, objects, findings);
  checkObjects(ctx);
  checkWorkloads(ctx);
  checkCoordinator(ctx);
  checkServices(ctx);
}

// Renders and checks one tree; returns the findings, printing a line per target.
function checkTree(root, scratch, quiet) {
  const findings = [];
  for (const target of targets(root, scratch)) {
    let objects;
    try {
      objects = render(target.dir);
    } catch (error) {
      findings.push(`${target.name}: ${error.message}`);
      continue;
    }
    const before = findings.length;
    for (const object of objects) {
      validateSchema(
          object,
          (message) =>
              findings.push(`${target.name}: ${object.kind}/${object.metadata?.name}: ${message}`));
    }
    checkRules(target, objects, findings);
    if (!quiet) {
      const kinds = [...new Set(objects.map((o) => o.kind))].sort().join(', ');
      const status = findings.length === before ? 'ok  ' : 'FAIL';
      console.log(`${status} ${target.name}: ${objects.length} objects (${kinds})`);
    }
  }
  return findings;
}

// deploy/prometheus/rules.yml is written for plain Prometheus (rule_files). docs/deploy.md wraps
// it into a PrometheusRule when it is applied, so that no copy of it can drift: that object must
// be valid too.
function checkPrometheusRule(root) {
  const file = path.join(root, '..', 'prometheus', 'rules.yml');
  if (!fs.existsSync(file)) return [];
  const spec = YAML.parse(fs.readFileSync(file, 'utf8'));
  const findings = [];
  validateSchema(
      {
        apiVersion: 'monitoring.coreos.com/v1',
        kind: 'PrometheusRule',
        metadata: {name: 'moetrain', namespace: NAMESPACE},
        spec,
      },
      (message) => findings.push(`deploy/prometheus/rules.yml as a PrometheusRule: ${message}`));
  if (!Array.isArray(spec?.groups) || spec.groups.length === 0) {
    findings.push('deploy/prometheus/rules.yml has no rule groups');
  }
  const status = findings.length === 0 ? 'ok  ' : 'FAIL';
  const groups = spec?.groups?.length ?? 0;
  console.log(`${status} deploy/prometheus/rules.yml as a PrometheusRule: ${groups} groups`);
  return findings;
}

// --- The rules bite: a copy of the tree, broken one way at a time -------------------------------

// Each: the file under deploy/k8s, the text replaced (its first occurrence), the replacement, the
// finding expected, and optionally a file to add.
const BREAKAGES = [
  {file: 'base/coordinator.yaml', from: 'replicas: 1', to: 'replicas: 2',
   expect: 'replicas is 2, not 1'},
  {file: 'base/coordinator.yaml', from: 'type: Recreate', to: 'type: RollingUpdate',
   expect: 'strategy is not Recreate'},
  {file: 'base/coordinator.yaml', from: 'targetPort: http', to: 'targetPort: metrics',
   expect: 'targetPort metrics is not a port'},
  {file: 'base/coordinator.yaml', from: 'port: 7070\n            periodSeconds: 5',
   to: 'port: 7071\n            periodSeconds: 5', expect: 'readinessProbe is not a gRPC probe'},
  {file: 'base/coordinator.yaml', from: 'containerPort: 7070', to: 'containerPort: "7070"',
   expect: 'must be integer'},
  {file: 'base/worker.yaml', from: 'component: worker\n    spec:',
   to: 'component: workers\n    spec:', expect: 'does not match the pod template labels'},
  {file: 'overlays/cpu/kustomization.yaml', from: '{cpu: 500m, memory: 1Gi}', to: '{cpu: 500m}',
   expect: 'no resources.requests.memory'},
  {file: 'base/worker.yaml', from: '--threads=$(MOETRAIN_NUM_THREADS)',
   to: '--threads=$(MOETRAIN_THREADS)', expect: 'refers to an undefined variable'},
  {file: 'base/worker.yaml', from: 'readOnlyRootFilesystem: true',
   to: 'readOnlyRootFilesystem: false', expect: 'readOnlyRootFilesystem is not true'},
  {file: 'base/worker.yaml', from: 'mountPath: /var/lib/moetrain/checkpoints',
   to: 'mountPath: /checkpoints', expect: 'is not a persistent volume here'},
  {file: 'base/worker.yaml', from: 'value: moetrain-coordinator:7070',
   to: 'value: moetrain-coordinator:7071', expect: 'is not its Service\'s grpc port'},
  {file: 'overlays/cpu/kustomization.yaml', from: 'newTag: 0.4.0-cpu\n  - name: moetrain-worker',
   to: 'newTag: latest\n  - name: moetrain-worker', expect: 'uses the tag latest'},
  {file: 'overlays/cpu/kustomization.yaml', from: 'MOETRAIN_NUM_THREADS=1',
   to: 'MOETRAIN_NUM_THREADS=4', expect: '--threads=4 with a CPU limit of 1 cores'},
  {file: 'overlays/gpu/kustomization.yaml', from: 'MOETRAIN_DEVICES=cuda\n',
   to: 'MOETRAIN_DEVICES=cuda:0,1,2,3\n', expect: 'lists 4 GPUs, the limit is 8'},
  {file: 'overlays/gpu/kustomization.yaml', from: 'MOETRAIN_DEVICES=cuda\n',
   to: 'MOETRAIN_DEVICES=cpu\n', expect: 'the workers would not use their GPUs'},
  {file: 'overlays/gpu/worker-gpu.yaml', from: 'nvidia.com/gpu: 8\n            limits:',
   to: 'nvidia.com/gpu: 4\n            limits:', expect: 'request 4 differs from the limit 8'},
  {file: 'overlays/gpu/worker-gpu.yaml', from: 'value: compute,utility',
   to: 'value: compute,utility\n            - name: NVIDIA_VISIBLE_DEVICES\n              value: all',
   expect: 'sets NVIDIA_VISIBLE_DEVICES'},
  {file: 'overlays/gpu/worker-gpu.yaml', from: 'value: compute,utility', to: 'value: utility',
   expect: 'lacks compute'},
  {file: 'overlays/gpu/kustomization.yaml', from: 'resources:\n  - ../../base',
   to: 'resources:\n  - ../../base\n  - token.yaml', expect: 'a Secret with data in the manifests',
   add: ['overlays/gpu/token.yaml',
         'apiVersion: v1\nkind: Secret\nmetadata: {name: moetrain-token}\n' +
             'stringData: {token: hunter2}\n']},
  {file: 'base/coordinator.yaml',
   from: '            - --worker-token-file=/etc/moetrain/worker-token/token\n', to: '',
   expect: '--worker-token-file=undefined is not in the mounted worker token Secret'},
  {file: 'base/worker.yaml', from: 'value: /etc/moetrain/worker-token/token',
   to: 'value: /etc/moetrain/token/token',
   expect: 'the worker token file /etc/moetrain/token/token is not in the mounted worker token'},
  {file: 'base/worker.yaml', from: 'mountPath: /etc/moetrain/worker-token',
   to: 'mountPath: /etc/moetrain/token', expect: 'mounts the users\' token Secret'},
  {file: 'base/checkpoints.yaml', from: '[ReadWriteMany]', to: '[ReadWriteOnce]',
   expect: 'is not ReadWriteMany'},
  {file: 'components/servicemonitor/servicemonitor.yaml', from: 'port: http', to: 'port: metrics',
   expect: 'endpoint port metrics is not a port'},
  {file: 'components/servicemonitor/servicemonitor.yaml', from: 'port: metrics', to: 'port: http',
   expect: 'endpoint port http is not a port'},
  {file: 'base/worker.yaml', from: '--metrics-listen=0.0.0.0:7072',
   to: '--metrics-listen=0.0.0.0:9400', expect: 'is not the container port metrics (7072)'},
  {file: 'base/worker.yaml', from: '--metrics-listen=0.0.0.0:7072',
   to: '--metrics-listen=127.0.0.1:7072', expect: 'listens on loopback only'},
  {file: 'base/worker.yaml', from: '            - --metrics-listen=0.0.0.0:7072\n', to: '',
   expect: 'no --metrics-listen'},
  {file: 'base/worker.yaml', from: 'targetPort: metrics', to: 'targetPort: 7072',
   expect: 'no Service lists the worker port metrics'},
];

function checkRulesBite(root, scratch) {
  const failures = [];
  BREAKAGES.forEach(({file, from, to, expect, add}, index) => {
    const copy = path.join(scratch, `broken-${index}`);
    fs.cpSync(root, copy, {recursive: true});
    const target = path.join(copy, file);
    const text = fs.readFileSync(target, 'utf8');
    if (!text.includes(from)) {
      failures.push(
          `breakage ${index} no longer applies: '${file}' has no '${from}' (update BREAKAGES)`);
      return;
    }
    fs.writeFileSync(target, text.replace(from, to));
    if (add) fs.writeFileSync(path.join(copy, add[0]), add[1]);
    const findings = checkTree(copy, path.join(scratch, `broken-${index}-targets`), true);
    if (!findings.some((f) => f.includes(expect))) {
      failures.push(
          `breakage ${index} (${file}: '${from}' → '${to}') was not caught as '${expect}'; ` +
          `findings: ${findings.length ? findings.join(' | ') : 'none'}`);
    }
  });
  return failures;
}

function main() {
  const root = path.resolve(process.argv[2] || '');
  if (!process.argv[2] || !fs.existsSync(path.join(root, 'base', 'kustomization.yaml'))) {
    console.error(
        'usage: node validate.js DEPLOY_K8S_DIR (the folder holding base/ and overlays/)');
    return 2;
  }
  const kustomize = kustomizeVersion();
  if (kustomize.error) {
    console.log(`SKIP: ${kustomize.error}; install kubectl 1.21 or later to check deploy/k8s`);
    return 77;
  }
  console.log(`kubectl kustomize ${kustomize.version}`);
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'moetrain-k8s-'));
  try {
    const findings = checkTree(root, path.join(scratch, 'targets'), false);
    for (const finding of findings) console.log(`  ${finding}`);
    findings.push(...checkPrometheusRule(root));
    const failures = checkRulesBite(root, scratch);
    for (const failure of failures) console.log(`  ${failure}`);
    console.log(
        `${BREAKAGES.length - failures.length} of ${BREAKAGES.length} deliberate breakages caught`);
    return findings.length === 0 && failures.length === 0 ? 0 : 1;
  } finally {
    fs.rmSync(scratch, {recursive: true, force: true});
  }
}

process.exitCode = main();
