// serve_client.js MODE PORT KEY: clients of `tide serve` for tests/lua/serve_spec.lua.
// Prints one JSON object on stdout: what each case sent and what came back.
//   openai  the official `openai` npm client, unmodified: chat and completions,
//           streaming and not, logprobs, usage; then 16 concurrent streams
//   drop    a stream dropped mid-way while another runs; /metrics afterwards
//   bad     malformed and hostile input, each with its status; the server keeps serving
'use strict';
const path = require('path');
const http = require('http');
const net = require('net');

const [mode, portArg, key, pidArg] = process.argv.slice(2);
const port = Number(portArg);
const root = path.resolve(__dirname, '..', '..');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function request(method, p, body, headers = {}) {
  return new Promise((resolve, reject) => {
    const h = Object.assign({ Authorization: `Bearer ${key}` }, headers);
    let data = body;
    if (body !== undefined && typeof body !== 'string' && !Buffer.isBuffer(body)) data = JSON.stringify(body);
    if (data !== undefined) h['Content-Type'] = h['Content-Type'] || 'application/json';
    const req = http.request({ host: '127.0.0.1', port, method, path: p, headers: h, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json = null;
        try { json = JSON.parse(text); } catch (e) { /* not JSON */ }
        resolve({ status: res.statusCode, headers: res.headers, text, json });
      });
    });
    req.on('error', reject);
    if (data !== undefined) req.write(data);
    req.end();
  });
}

// A raw exchange: write `bytes`, collect everything until the server closes
// or `ms` pass.
function raw(bytes, ms = 5000) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    const chunks = [];
    const t0 = Date.now();
    const timer = setTimeout(() => { s.destroy(); resolve({ text: Buffer.concat(chunks).toString('latin1'), closed: false }); }, ms);
    s.on('connect', () => s.write(bytes));
    s.on('data', (c) => chunks.push(c));
    s.on('error', () => {});
    s.on('close', () => {
      clearTimeout(timer);
      resolve({ text: Buffer.concat(chunks).toString('latin1'), closed: true, ms: Date.now() - t0 });
    });
  });
}

function statusOf(text) {
  const m = /^HTTP\/1\.[01] (\d+)/.exec(text);
  return m ? Number(m[1]) : 0;
}

// Parse an SSE body into its data payloads.
function sse(text) {
  return text.split('\n\n').filter((b) => b.startsWith('data: ')).map((b) => b.slice(6));
}

async function metrics() {
  const r = await request('GET', '/metrics');
  const m = {};
  for (const line of r.text.split('\n')) {
    const x = /^([a-z_]+(?:\{[^}]*\})?) ([-0-9.e+]+)$/.exec(line);
    if (x) m[x[1]] = Number(x[2]);
  }
  return m;
}

// ------------------------------------------------------------------ openai
async function modeOpenai() {
  const { OpenAI } = require(path.join(root, 'build-deps', 'node_modules', 'openai'));
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0, timeout: 300000 });
  const out = { cases: {} };
  const run = async (name, kind, body, stream) => {
    const t0 = Date.now();
    const api = kind === 'chat' ? client.chat.completions : client.completions;
    if (!stream) {
      const r = await api.create(body);
      out.cases[name] = { kind, body, result: r, ms: Date.now() - t0 };
      return;
    }
    const s = await api.create(Object.assign({ stream: true }, body));
    const chunks = [];
    for await (const c of s) chunks.push(c);
    out.cases[name] = { kind, body, chunks, ms: Date.now() - t0 };
  };
  const msgs = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Name a colour.' }];
  await run('chat', 'chat', { model: 'demo1', messages: msgs, max_tokens: 5, seed: 11, logprobs: true, top_logprobs: 2,
    return_token_ids: true }, false);
  await run('completion', 'completion', { model: 'demo1', prompt: 'Once upon a time', max_tokens: 5, seed: 12,
    logprobs: 3, temperature: 0.7, top_k: 20, return_token_ids: true }, false);
  await run('chat_stream', 'chat', { model: 'demo1', messages: msgs, max_tokens: 5, seed: 13, logprobs: true,
    top_logprobs: 1, stream_options: { include_usage: true }, return_token_ids: true }, true);
  await run('completion_stream', 'completion', { model: 'demo1', prompt: [0, 19923, 14], max_tokens: 5, seed: 14,
    min_p: 0.01, presence_penalty: 0.5, frequency_penalty: 0.2, logit_bias: { '19923': -100 }, stop: ['zzzz'],
    return_token_ids: true }, true);
  // >= 16 concurrent streams, different seeds
  const t0 = Date.now();
  await Promise.all(Array.from({ length: 16 }, (_, i) => run(`many${i}`, 'completion',
    { model: 'demo1', prompt: `Story number ${i}:`, max_tokens: 4, seed: 100 + i, return_token_ids: true }, true)));
  out.many_ms = Date.now() - t0;
  const models = await client.models.list();
  out.models = models.data;
  return out;
}

// ------------------------------------------------------------------ drop
async function modeDrop() {
  const out = {};
  const before = await metrics();
  // A: a long stream that the client abandons after two chunks
  const dropped = new Promise((resolve) => {
    const body = JSON.stringify({ prompt: 'A long story:', max_tokens: 400, seed: 1, stream: true });
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/completions', agent: false,
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' } }, (res) => {
      let n = 0;
      res.on('data', (c) => {
        n += (c.toString().match(/data: /g) || []).length;
        if (n >= 2) { req.destroy(); resolve(n); }
      });
    });
    req.on('error', () => {});
    req.end(body);
  });
  // B: runs at the same time and must be unaffected
  const bodyB = { prompt: 'Meanwhile,', max_tokens: 6, seed: 2, stream: true, return_token_ids: true };
  const [nA, rB] = await Promise.all([dropped, request('POST', '/v1/completions', bodyB)]);
  out.dropped_after_chunks = nA;
  out.b = { body: bodyB, status: rB.status, events: sse(rB.text) };
  // the dropped request's blocks come back
  const t0 = Date.now();
  let m;
  for (;;) {
    m = await metrics();
    if (m.tide_requests_running === 0 && m['tide_cache_swa_blocks{state="used"}'] === 0 &&
        m.tide_requests_cancelled_total > (before.tide_requests_cancelled_total || 0)) break;
    if (Date.now() - t0 > 30000) break;
    await sleep(50);
  }
  out.freed_ms = Date.now() - t0;
  out.metrics = m;
  out.before = before;
  return out;
}

// ------------------------------------------------------------------ bad input
async function modeBad() {
  const out = {};
  const post = (p, body, h) => request('POST', p, body, h);
  const show = (r) => ({ status: r.status, error: r.json && r.json.error, retry: r.headers['retry-after'] });
  out.malformed = show(await post('/v1/completions', '{"prompt": "x", '));
  out.not_object = show(await post('/v1/completions', '[1, 2]'));
  out.wrong_type = show(await post('/v1/completions', { prompt: 5, max_tokens: 2 }));
  out.wrong_type2 = show(await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_tokens: 'many' }));
  out.unknown_field = show(await post('/v1/completions', { prompt: 'x', max_tokens: 2, frobnicate: true }));
  out.unknown_msg_field = show(await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'x', mood: 1 }] }));
  out.too_long = show(await post('/v1/completions', { prompt: 'x', max_tokens: 100000 }));
  out.ids_out_of_range = show(await post('/v1/completions', { prompt: [0, 129280], max_tokens: 2 }));
  out.ids_negative = show(await post('/v1/completions', { prompt: [0, -1], max_tokens: 2 }));
  out.detok_out_of_range = show(await post('/detokenize', { tokens: [5, 1e9] }));
  out.bias_out_of_range = show(await post('/v1/completions', { prompt: 'x', max_tokens: 2, logit_bias: { '999999': 1 } }));
  // invalid UTF-8 inside a JSON string (raw bytes, not an escape)
  const bad = Buffer.concat([Buffer.from('{"prompt": "ab'), Buffer.from([0xff, 0xc3, 0x28]), Buffer.from('", "max_tokens": 2}')]);
  out.invalid_utf8 = show(await post('/v1/completions', bad));
  out.lone_surrogate = show(await post('/v1/completions', '{"prompt": "a\\ud800b", "max_tokens": 2}'));
  // samplers: only names inside the server's directory
  out.sampler_path = show(await post('/v1/completions', { prompt: 'x', max_tokens: 2, sampler: '../../etc/passwd' }));
  out.sampler_abs = show(await post('/v1/completions', { prompt: 'x', max_tokens: 2, sampler: '/etc/passwd' }));
  out.sampler_missing = show(await post('/v1/completions', { prompt: 'x', max_tokens: 2, sampler: 'nope' }));
  const ok = await post('/v1/completions', { prompt: 'x', max_tokens: 2, sampler: 'greedy_test', return_token_ids: true });
  out.sampler_ok = Object.assign(show(ok), { body: ok.json });
  // API key
  out.no_key = show(await request('POST', '/v1/completions', { prompt: 'x' }, { Authorization: '' }));
  out.wrong_key = show(await request('GET', '/v1/models', undefined, { Authorization: 'Bearer wrong' }));
  out.health_no_key = show(await request('GET', '/health', undefined, { Authorization: '' }));
  out.not_found = show(await request('GET', '/v2/nothing'));
  out.wrong_method = show(await request('GET', '/v1/completions'));
  // huge bodies: declared (refused before reading) and chunked (read, dropped)
  const declared = await raw('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
    'Content-Length: 50000000\r\n\r\n{"prompt": "');
  out.huge_declared = { status: statusOf(declared.text), body: declared.text.split('\r\n\r\n')[1] };
  const big = '{"prompt": "' + 'a'.repeat(3 << 20) + '"}';
  const chunked = await new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/completions', agent: false,
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked' } },
    (res) => { const c = []; res.on('data', (d) => c.push(d)); res.on('end', () => resolve({ status: res.statusCode, text: Buffer.concat(c).toString() })); });
    req.on('error', (e) => resolve({ status: 0, text: String(e) }));
    for (let i = 0; i < big.length; i += 65536) req.write(big.slice(i, i + 65536));
    req.end();
  });
  out.huge_chunked = { status: chunked.status, error: (() => { try { return JSON.parse(chunked.text).error; } catch (e) { return null; } })() };
  // slow-loris: headers trickling in; others are served meanwhile, and the
  // server closes the slow connection after its timeout
  const loris = new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    const t0 = Date.now();
    let i = 0;
    const parts = ['POST /v1/completions HTTP/1.1\r\n', 'Host: x\r\n', 'X-A: 1\r\n'];
    const timer = setInterval(() => { if (i < parts.length && !s.destroyed) s.write(parts[i++]); }, 1000);
    s.on('error', () => {});
    s.on('close', () => { clearInterval(timer); resolve({ closed_ms: Date.now() - t0, parts_sent: i }); });
    setTimeout(() => { clearInterval(timer); s.destroy(); }, 25000);
  });
  await sleep(200);
  const during = await request('GET', '/health');
  out.during_loris = during.status;
  out.loris = await loris;
  // garbage bytes, a request line without HTTP
  const garbage = await raw(Buffer.from([0x16, 0x03, 0x01, 0x00, 0xff, 0x00, 0x0d, 0x0a, 0x0d, 0x0a, 0x80, 0x81]), 3000);
  out.garbage = { status: statusOf(garbage.text), closed: garbage.closed };
  const nohttp = await raw('HELLO THERE\r\n\r\n', 3000);
  out.nohttp = { status: statusOf(nohttp.text), closed: nohttp.closed };
  const longhdr = await raw('GET /health HTTP/1.1\r\nHost: x\r\nX-Long: ' + 'b'.repeat(100000) + '\r\n\r\n', 3000);
  out.long_header = { status: statusOf(longhdr.text), closed: longhdr.closed };
  // still serving
  out.health_after = (await request('GET', '/health')).status;
  const last = await post('/v1/completions', { prompt: 'still here', max_tokens: 2, seed: 3 });
  out.completion_after = last.status;
  return out;
}

// ------------------------------------------------------------------ queue full, shutdown
// The server runs with --parallel 1 --queue 1: A runs, B waits, C is refused;
// then SIGTERM (to PIDARG) ends A within the server's --shutdown bound.
function openStream(body, onToken) {
  return new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/completions', agent: false,
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' } }, (res) => {
      const st = { status: res.statusCode, tokens: 0, ended: null };
      st.done = new Promise((done) => {
        res.on('data', (c) => {
          const n = (c.toString().match(/"token_ids":\[\d/g) || []).length;
          st.tokens += n;
          if (n && onToken) onToken(st);
        });
        const end = () => { if (st.ended === null) { st.ended = Date.now(); done(); } };
        res.on('end', end);
        res.on('close', end);
        res.on('error', end);
      });
      resolve(st);
    });
    req.on('error', () => resolve({ status: 0, tokens: 0, done: Promise.resolve() }));
    req.end(JSON.stringify(body));
  });
}

async function modeQueue() {
  const out = {};
  let firstToken;
  const gotToken = new Promise((r) => { firstToken = r; });
  const a = await openStream({ prompt: 'A', max_tokens: 400, seed: 1, stream: true, return_token_ids: true },
    () => firstToken());
  await gotToken;
  const b = await openStream({ prompt: 'B', max_tokens: 2, seed: 2, stream: true, return_token_ids: true });
  const c = await request('POST', '/v1/completions', { prompt: 'C', max_tokens: 2 });
  out.a_status = a.status;
  out.b_status = b.status;
  out.c = { status: c.status, retry: c.headers['retry-after'], error: c.json && c.json.error };
  const t0 = Date.now();
  process.kill(Number(pidArg), 'SIGTERM');
  await Promise.race([a.done, sleep(20000)]);
  out.a_ended_ms = (a.ended || Date.now()) - t0;
  out.a_tokens = a.tokens;
  return out;
}

(async () => {
  const f = { openai: modeOpenai, drop: modeDrop, bad: modeBad, queue: modeQueue }[mode];
  if (!f) throw new Error('mode must be openai, drop or bad');
  const r = await f();
  process.stdout.write(JSON.stringify(r) + '\n');
})().catch((e) => {
  process.stdout.write(JSON.stringify({ fatal: String(e && e.stack || e) }) + '\n');
  process.exit(1);
});
