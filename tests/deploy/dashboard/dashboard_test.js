// The coordinator's dashboard in a real browser: starts a real moetrain-coordinator (with a token)
// and a real moetrain-worker on 127.0.0.1, submits a small real job with the moetrain CLI, and
// drives Debian's headless Chromium (through playwright-core) against the page while the job
// trains. Checks: the page asks for the token, the job appears in the list, its loss curve has
// points, the expert-load heatmap has layers × experts cells, the workers view lists the worker,
// and nothing in the browser failed (no console error, page error, failed request or HTTP error).
// Writes screenshots into the working directory (the build folder); with a second argument, also
// copies the job view's there (to refresh docs/images/dashboard.png: see docs/service.md).
//
//   node dashboard_test.js BIN_DIR [DOCS_SCREENSHOT]
//
// Every process it starts is killed at the end, also when a check fails. Exit code 77 (a skip)
// when Chromium is not installed.
"use strict";

const { spawn, execFile } = require("child_process");
const fs = require("fs");
const os = require("os");
const path = require("path");

const CHROMIUM = "/usr/bin/chromium";
const TOKEN = "dashboard-browser-test-token";
// Long enough that the job still trains while the browser looks; the test stops it at the end.
const STEPS = 200000;
const MOE_LAYERS = 3;
const EXPERTS = 8;
const PATIENCE_MS = 120000;

const spec = (name, steps) => `name: ${name}
model:
  vocab_size: 64
  hidden_size: 64
  num_layers: 4
  num_heads: 4
  num_kv_heads: 2
  ffn_dim: 96
  first_dense_layers: 1
  moe:
    num_experts: ${EXPERTS}
    top_k: 2
    expert_ffn_dim: 32
data:
  format: SYNTHETIC
  synthetic_vocab_size: 48
  seed: 3
train:
  steps: ${steps}
  batch_size: 8
  seq_len: 64
  optimizer:
    lr: 1e-3
    warmup_steps: 50
  seed: 1
  log_every: 5
  eval_every: 50
  eval_batches: 2
checkpoint:
  every_steps: 100000
resources:
  workers: 1
`;

const children = [];
let workDir = null;

function log(message) {
  process.stdout.write(`dashboard_test: ${message}\n`);
}

function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`);
  log(`ok: ${message}`);
}

// A daemon with its output in a log file of the temporary directory.
function startDaemon(name, binary, args) {
  const logPath = path.join(workDir, `${name}.log`);
  const out = fs.openSync(logPath, "a");
  const child = spawn(binary, args, {
    stdio: ["ignore", out, out],
    env: { ...process.env, MOETRAIN_NUM_THREADS: "1", OMP_NUM_THREADS: "1" },
  });
  fs.closeSync(out);
  child.logPath = logPath;
  child.name = name;
  children.push(child);
  child.on("exit", (code, signal) => {
    child.exited = { code, signal };
  });
  return child;
}

async function waitFor(what, probe, timeoutMs = PATIENCE_MS) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise(resolve => setTimeout(resolve, 100));
  }
}

function run(binary, args) {
  return new Promise((resolve, reject) => {
    execFile(binary, args, { timeout: 60000 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${path.basename(binary)} ${args.join(" ")}: ${error.message}\n${stderr}`));
      else resolve(stdout);
    });
  });
}

async function stopAll() {
  for (const child of children.reverse()) {
    if (child.exited) continue;
    // SIGTERM first (the worker checkpoints and leaves), SIGKILL for whatever is left.
    child.kill("SIGTERM");
    const deadline = Date.now() + 10000;
    while (!child.exited && Date.now() < deadline) await new Promise(r => setTimeout(r, 50));
    if (!child.exited) {
      child.kill("SIGKILL");
      log(`${child.name} did not stop on SIGTERM: killed`);
    }
  }
}

function dumpLogs() {
  for (const child of children) {
    try {
      const text = fs.readFileSync(child.logPath, "utf8");
      process.stdout.write(`----- ${child.name}.log (last 3000 characters) -----\n${text.slice(-3000)}\n`);
    } catch (e) {
      // no log yet
    }
  }
}

async function main() {
  const [binDir, docsScreenshot] = process.argv.slice(2);
  if (!binDir) {
    console.error("usage: dashboard_test.js BIN_DIR [DOCS_SCREENSHOT]");
    return 2;
  }
  if (!fs.existsSync(CHROMIUM)) {
    log(`${CHROMIUM} is not installed (scripts/setup.sh installs it): skipped`);
    return 77;
  }
  for (const name of ["moetrain-coordinator", "moetrain-worker", "moetrain"]) {
    if (!fs.existsSync(path.join(binDir, name))) throw new Error(`${name} is not built in ${binDir}`);
  }
  const { chromium } = require("playwright-core");

  workDir = fs.mkdtempSync(path.join(os.tmpdir(), "dashboard_test."));
  const tokenFile = path.join(workDir, "token");
  fs.writeFileSync(tokenFile, TOKEN + "\n");

  const coordinator = startDaemon("coordinator", path.join(binDir, "moetrain-coordinator"), [
    "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
    "--state-db", path.join(workDir, "state.db"),
    "--checkpoint-dir", path.join(workDir, "checkpoints"),
    "--token-file", tokenFile]);
  const ports = await waitFor("the coordinator to serve", () => {
    if (coordinator.exited) throw new Error(`the coordinator exited: ${JSON.stringify(coordinator.exited)}`);
    const text = fs.readFileSync(coordinator.logPath, "utf8");
    const match = text.match(/serving: grpc 127\.0\.0\.1:(\d+), http 127\.0\.0\.1:(\d+)/);
    return match && { grpc: Number(match[1]), http: Number(match[2]) };
  }, 30000);
  const grpcAddress = `127.0.0.1:${ports.grpc}`;
  const base = `http://127.0.0.1:${ports.http}`;
  log(`coordinator serving gRPC on ${grpcAddress}, HTTP on ${base}`);

  startDaemon("worker", path.join(binDir, "moetrain-worker"), [
    "--coordinator", grpcAddress, "--token-file", tokenFile, "--threads", "1",
    "--work-dir", path.join(workDir, "worker"), "--name", "dashboard-worker"]);

  // A short job first, which the one worker finishes before it starts the long one.
  const submit = async (name, steps) => {
    const specPath = path.join(workDir, `${name}.yaml`);
    fs.writeFileSync(specPath, spec(name, steps));
    const submitted = JSON.parse(await run(path.join(binDir, "moetrain"),
      ["submit", specPath, "--json", "--coordinator", grpcAddress, "--token-file", tokenFile]));
    check(typeof submitted.id === "string" && submitted.id.length > 0,
          `moetrain submit created job ${submitted.id} (${name}, ${steps} steps)`);
    return submitted.id;
  };
  const shortId = await submit("dashboard-warmup", 60);
  const jobId = await submit("dashboard-demo", STEPS);

  // The API itself, outside the browser: it wants the token.
  const refused = await fetch(`${base}/api/v1/jobs`);
  check(refused.status === 401, `GET /api/v1/jobs without the token is ${refused.status} (401)`);

  const browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
  const problems = [];
  try {
    const context = await browser.newContext({ viewport: { width: 1360, height: 900 }, deviceScaleFactor: 1 });
    const page = await context.newPage();
    page.on("console", message => {
      if (message.type() === "error") problems.push(`console error: ${message.text()}`);
    });
    page.on("pageerror", error => problems.push(`page error: ${error.message}`));
    page.on("requestfailed", request =>
      problems.push(`request failed: ${request.url()}: ${request.failure() && request.failure().errorText}`));
    page.on("response", response => {
      if (response.status() >= 400) problems.push(`HTTP ${response.status()} for ${response.url()}`);
    });
    page.on("request", request => {
      if (!request.url().startsWith(base)) problems.push(`request outside the coordinator: ${request.url()}`);
    });

    await page.goto(`${base}/`);
    await page.waitForSelector("#auth.show", { timeout: 10000 });
    check(true, "the page asks for the token before calling the API");
    await page.fill("#auth-token", TOKEN);
    await page.click("#auth-submit");

    const row = `#jobs-table tr[data-job="${jobId}"]`;
    await page.waitForSelector(row, { timeout: 30000 });
    check(true, `job ${jobId} is listed`);
    await page.waitForFunction(selector => {
      const el = document.querySelector(selector);
      return el && el.textContent.includes("RUNNING");
    }, row, { timeout: PATIENCE_MS });
    const rowText = (await page.textContent(row)).replace(/\s+/g, " ");
    check(rowText.includes("dashboard-demo") && rowText.includes(`/ ${STEPS}`),
          `the list shows the job RUNNING with its progress: "${rowText.trim()}"`);
    // The short job ran before: the list shows how it ended.
    await page.waitForFunction(selector => {
      const el = document.querySelector(selector);
      return el && el.textContent.includes("SUCCEEDED");
    }, `#jobs-table tr[data-job="${shortId}"]`, { timeout: 30000 });
    const order = await page.$$eval("#jobs-table tr[data-job]", rows => rows.map(r => r.dataset.job));
    check(order.length === 2 && order[0] === jobId && order[1] === shortId,
          "the list shows the running job above the finished one, SUCCEEDED");
    await page.screenshot({ path: "dashboard-jobs.png" });

    await page.click(`${row} a`);
    await page.waitForSelector("#chart-loss", { timeout: 10000 });
    // Enough reports for a curve worth a screenshot: two evaluations and a few dozen steps.
    await page.waitForFunction(() => {
      const loss = document.querySelector('#chart-loss [data-series="loss"]');
      const evals = document.querySelector('#chart-loss [data-series="eval_loss"]');
      return loss && Number(loss.dataset.points) >= 30 && evals && Number(evals.dataset.points) >= 2;
    }, null, { timeout: PATIENCE_MS });
    const lossPoints = await page.$eval('#chart-loss [data-series="loss"]', el => Number(el.dataset.points));
    const evalPoints = await page.$eval('#chart-loss [data-series="eval_loss"]', el => Number(el.dataset.points));
    check(lossPoints >= 2, `the loss curve has ${lossPoints} points (>= 2), the eval curve ${evalPoints}`);
    const tpsPoints = await page.$eval('#chart-tps [data-series="tokens_per_s"]', el => Number(el.dataset.points));
    check(tpsPoints >= 2, `the tokens/s curve has ${tpsPoints} points`);

    // Live: the curve grows without a reload.
    await page.waitForFunction(before => {
      const loss = document.querySelector('#chart-loss [data-series="loss"]');
      return loss && Number(loss.dataset.points) > before;
    }, lossPoints, { timeout: 30000 });
    check(true, "the loss curve grew between two polls");

    const heat = await page.$eval("#heatmap svg", svg => ({
      layers: Number(svg.dataset.layers),
      experts: Number(svg.dataset.experts),
      cells: svg.querySelectorAll("rect.cell").length,
    }));
    check(heat.layers === MOE_LAYERS && heat.experts === EXPERTS && heat.cells === MOE_LAYERS * EXPERTS,
          `the heatmap has ${heat.layers} layers x ${heat.experts} experts = ${heat.cells} cells`);
    const title = await page.textContent("#job-name");
    check(title === "dashboard-demo", `the job view is titled "${title}"`);
    // Let the stat cards and curves settle on the same poll before the picture.
    await page.waitForTimeout(2500);
    await page.screenshot({ path: "dashboard.png", fullPage: true });
    if (docsScreenshot) {
      fs.mkdirSync(path.dirname(docsScreenshot), { recursive: true });
      fs.copyFileSync("dashboard.png", docsScreenshot);
      log(`screenshot: ${path.resolve("dashboard.png")}, copied to ${docsScreenshot}`);
    } else {
      log(`screenshot: ${path.resolve("dashboard.png")}`);
    }

    await page.click("#nav-workers");
    await page.waitForSelector("#workers-table tr[data-worker]", { timeout: 10000 });
    const workerText = (await page.textContent("#workers-table tbody")).replace(/\s+/g, " ");
    check(workerText.includes("dashboard-worker") && workerText.includes("BUSY") && workerText.includes(jobId),
          `the workers view lists the worker, busy with the job: "${workerText.trim()}"`);
    await page.screenshot({ path: "dashboard-workers.png" });
  } finally {
    await browser.close();
  }
  check(problems.length === 0,
        `no console errors, page errors, failed requests or HTTP errors${problems.length ? ":\n  " + problems.join("\n  ") : ""}`);
  return 0;
}

// Whatever ends this process (a check, ctest's timeout, Ctrl-C) takes the daemons with it.
process.on("exit", () => {
  for (const child of children) if (!child.exited) child.kill("SIGKILL");
});
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => process.exit(1));

main()
  .then(async code => {
    await stopAll();
    if (workDir && code === 0) fs.rmSync(workDir, { recursive: true, force: true });
    process.exit(code);
  })
  .catch(async error => {
    log(`FAILED: ${error.stack || error}`);
    dumpLogs();
    await stopAll();
    if (workDir) log(`logs kept in ${workDir}`);
    process.exit(1);
  });
