// Graphile Worker's no-op drain, as benchmarks/peers.py measures the Python peers:
// `node drain.mjs POSTGRES_URL N CONFIG_JSON` enqueues N no-op jobs (add_jobs, 1000 a
// call), prints {"ready": true}, waits for a line on stdin (the caller reads the CPU
// counters then), times one worker draining them, prints {"per_s": ...}, and waits for a
// second line before it stops (the caller reads the counters again while the pool's
// connections still stand). The drain ends when the last completion is committed.
// CONFIG_JSON: the runner's options ({"concurrency": 10} is
// Graphile's defaults at concurrency 10; "preset" carries worker options such as
// localQueue and completeJobBatchDelay).
import { createInterface } from "node:readline";
import { Logger, makeWorkerUtils, run } from "graphile-worker";

const [connectionString, nText, configText] = process.argv.slice(2);
const n = Number(nText);
const { preset, ...options } = JSON.parse(configText);

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const nextLine = async () => (await lines.next()).value;

// Quiet: its log lines would cost it time and mix with the results on stdout.
const logger = new Logger(() => () => {});
const utils = await makeWorkerUtils({ connectionString, logger });
await utils.migrate();
await utils.withPgClient(async (pg) => {
  for (let start = 0; start < n; start += 1000) {
    const count = Math.min(1000, n - start);
    await pg.query(
      `select graphile_worker.add_jobs(array(
         select json_populate_record(null::graphile_worker.job_spec,
                json_build_object('identifier', 'noop', 'payload', '{}'::json))
           from generate_series(1, $1)))`,
      [count],
    );
  }
});
console.log(JSON.stringify({ ready: true }));
await nextLine();

let done = 0;
let finish;
const finished = new Promise((resolve) => (finish = resolve));
const started = process.hrtime.bigint();
const runner = await run({
  connectionString,
  noHandleSignals: true,
  logger,
  pollInterval: 1000,
  ...options,
  preset: { worker: preset ?? {} },
  taskList: {
    noop: async () => {
      done += 1;
      if (done === n) finish();
    },
  },
});
await finished;
// Every job has run; with batched completions some are not yet committed. The drain
// ends when the last completion is (a completed job is deleted), as durafn's drains end
// at their last committed outcome.
await utils.withPgClient(async (pg) => {
  for (;;) {
    const { rows } = await pg.query("select count(*)::int as left from graphile_worker.jobs");
    if (rows[0].left === 0) break;
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
});
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
console.log(JSON.stringify({ per_s: n / seconds }));
await nextLine();
await runner.stop();
await utils.release();
process.exit(0);
