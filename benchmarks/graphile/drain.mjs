// Graphile Worker's no-op drain, as benchmarks/peers.py measures the Python peers:
// `node drain.mjs POSTGRES_URL N CONCURRENCY` enqueues N no-op jobs (add_jobs, 1000 a
// call), then times one worker draining them; prints {"per_s": ...}.
import { makeWorkerUtils, run } from "graphile-worker";

const [connectionString, nText, concurrencyText] = process.argv.slice(2);
const n = Number(nText);
const concurrency = Number(concurrencyText);

const utils = await makeWorkerUtils({ connectionString });
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

let done = 0;
let finish;
const finished = new Promise((resolve) => (finish = resolve));
const started = process.hrtime.bigint();
const runner = await run({
  connectionString,
  concurrency,
  noHandleSignals: true,
  pollInterval: 1000,
  taskList: {
    noop: async () => {
      done += 1;
      if (done === n) finish();
    },
  },
});
await finished;
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
await runner.stop();
await utils.release();
console.log(JSON.stringify({ per_s: n / seconds, concurrency }));
