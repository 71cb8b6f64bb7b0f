// Graphile Worker draining jobs that do work, for benchmarks/realwork.py:
// `node work.mjs POSTGRES_URL N TASK_MS CONFIG_JSON` enqueues N jobs (add_jobs, 1000 a
// call) whose task awaits TASK_MS milliseconds, closes the connection that enqueued them
// (its backend's statistics are flushed as it exits), prints {"ready": true}, and waits
// for a line on stdin (the caller opens its measuring window then). It then runs one
// worker until every job has run and its completion is committed (a completed job is
// deleted, so: until the jobs table is empty, read every 5 ms once the last task has
// returned), prints {"seconds": ..., "per_s": ...} measured from the first task's start
// to that commit, and waits for a second line before it stops (the caller closes its
// window first). CONFIG_JSON: the runner's options ({"concurrency": 100} is Graphile's
// defaults at concurrency 100; "preset" carries worker options such as localQueue and
// completeJobBatchDelay).
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { Logger, makeWorkerUtils, run } from "graphile-worker";
import pg from "pg";

const [connectionString, nText, msText, configText] = process.argv.slice(2);
const n = Number(nText);
const ms = Number(msText);
const { preset, ...options } = JSON.parse(configText);

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const nextLine = async () => (await lines.next()).value;

// Quiet: its log lines would cost it time and mix with the results on stdout.
const logger = new Logger(() => () => {});
const utils = await makeWorkerUtils({ connectionString, logger });
await utils.migrate();
await utils.withPgClient(async (client) => {
  for (let start = 0; start < n; start += 1000) {
    const count = Math.min(1000, n - start);
    await client.query(
      `select graphile_worker.add_jobs(array(
         select json_populate_record(null::graphile_worker.job_spec,
                json_build_object('identifier', 'work', 'payload', '{}'::json))
           from generate_series(1, $1)))`,
      [count],
    );
  }
});
await utils.release();
console.log(JSON.stringify({ ready: true }));
await nextLine();

const checker = new pg.Client({ connectionString });
await checker.connect();
let done = 0;
let first;
let finish;
const finished = new Promise((resolve) => (finish = resolve));
const runner = await run({
  connectionString,
  noHandleSignals: true,
  logger,
  pollInterval: 1000,
  ...options,
  preset: { worker: preset ?? {} },
  taskList: {
    work: async () => {
      first ??= process.hrtime.bigint();
      await sleep(ms);
      done += 1;
      if (done === n) finish();
    },
  },
});
await finished;
for (;;) {
  const { rows } = await checker.query("select count(*)::int as left from graphile_worker.jobs");
  if (rows[0].left === 0) break;
  await sleep(5);
}
const seconds = Number(process.hrtime.bigint() - first) / 1e9;
console.log(JSON.stringify({ seconds, per_s: n / seconds }));
await nextLine();
await runner.stop();
await checker.end();
process.exit(0);
