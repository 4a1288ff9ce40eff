// bench_serve_client.js PORT CONCURRENCY BODIES.json: a closed-loop load
// generator for `tide serve` (used by scripts/bench_serve.lua). Keeps
// CONCURRENCY streaming requests in flight until every body in the file was
// sent; records for each request the time to its first token and the gaps
// between token chunks as they arrive on the socket. Prints JSON.
'use strict';
const http = require('http');
const fs = require('fs');

const [portArg, concArg, file] = process.argv.slice(2);
const port = Number(portArg);
const conc = Number(concArg);
const bodies = JSON.parse(fs.readFileSync(file, 'utf8'));
const agent = new http.Agent({ keepAlive: true, maxSockets: conc });
const now = () => Number(process.hrtime.bigint()) / 1e9;

function one(body) {
  return new Promise((resolve, reject) => {
    const t0 = now();
    const data = JSON.stringify(Object.assign({}, body, { stream: true, return_token_ids: true }));
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/completions', agent,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) } }, (res) => {
      if (res.statusCode !== 200) { reject(new Error('status ' + res.statusCode)); return; }
      let buf = '';
      let first = null;
      let last = null;
      const gaps = [];
      let tokens = 0;
      res.setEncoding('utf8');
      res.on('data', (c) => {
        buf += c;
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k);
          buf = buf.slice(k + 2);
          if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
          const j = JSON.parse(ev.slice(6));
          const ids = j.choices && j.choices[0] && j.choices[0].token_ids;
          if (!ids || ids.length === 0) continue;
          const t = now();
          // several tokens in one chunk (one engine step sent at once) share its time
          for (let i = 0; i < ids.length; i++) {
            if (first === null) first = t;
            else gaps.push(i === 0 ? t - last : 0);
            last = t;
          }
          tokens += ids.length;
        }
      });
      res.on('end', () => resolve({ ttft: first - t0, gaps, tokens, time: now() - t0 }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

(async () => {
  const t0 = now();
  const results = [];
  let next = 0;
  async function worker() {
    while (next < bodies.length) {
      const b = bodies[next++];
      results.push(await one(b));
    }
  }
  await Promise.all(Array.from({ length: conc }, worker));
  process.stdout.write(JSON.stringify({ wall: now() - t0, results }) + '\n');
  agent.destroy();
})().catch((e) => { process.stdout.write(JSON.stringify({ fatal: String(e) }) + '\n'); process.exit(1); });
