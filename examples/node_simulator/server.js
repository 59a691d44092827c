// A simulator written in Node.js joins shoal's training: it serves shoal's EnvService, knowing
// nothing but proto/shoal.proto, and shoal trains on it as on `shoal serve-env`.
//
//   node server.js [--host 127.0.0.1] [--port 50051] [--num-envs 8] [--max-sessions 16]
//                  [--max-episode-steps 500] [--session-timeout-s 300] [--max-message-mb 4]
//   shoal train ppo --env remote://127.0.0.1:50051/CartPole-v1 --stop-return 475
//
// The simulator is cartpole.js (Gymnasium's CartPole-v1 written again). Each session owns
// --num-envs envs, stepped together with Gymnasium's same-step autoreset: where an episode ends,
// obs holds the next episode's first observation and final_obs the last of the one that ended.
// Env i of a session is seeded with seed + i.
//
// The guards of shoal's own servers: a bearer token (the file named by --token-file, or
// SHOAL_TOKEN) checked on every call and required to bind beyond loopback; a message size limit;
// malformed bytes, bad arrays and actions outside the action space get INVALID_ARGUMENT; unknown
// sessions and env ids NOT_FOUND; a full server RESOURCE_EXHAUSTED; idle sessions (a client that
// vanished) are closed; the standard gRPC health service answers without a token. A bad request
// fails that call only: the server goes on serving.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const net = require('net');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { HealthImplementation } = require('grpc-health-check');
const { CartPole, OBS_HIGH, ACTIONS } = require('./cartpole');

const PROTO = path.join(__dirname, '..', '..', 'proto', 'shoal.proto');
const ENV_ID = 'CartPole-v1';
const INTEGERS = { int8: Int8Array, int16: Int16Array, int32: Int32Array, int64: BigInt64Array,
  uint8: Uint8Array, uint16: Uint16Array, uint32: Uint32Array, uint64: BigUint64Array, bool: Uint8Array };

class Failure extends Error {  // fails the current call with a gRPC status
  constructor(code, details) {
    super(details);
    this.code = code;
    this.details = details;
  }
}

function options(argv) {
  const defaults = { host: '127.0.0.1', port: 50051, 'num-envs': 8, 'max-sessions': 16, 'max-episode-steps': 500,
    'session-timeout-s': 300, 'max-message-mb': 4, 'token-file': null };
  const out = { ...defaults };
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '');
    if (!argv[i].startsWith('--') || !(name in defaults) || argv[i + 1] === undefined) {
      throw new Error(`usage: node server.js ${Object.keys(defaults).map((k) => `[--${k} ...]`).join(' ')}`);
    }
    out[name] = typeof defaults[name] === 'number' ? Number(argv[i + 1]) : argv[i + 1];
    if (Number.isNaN(out[name])) throw new Error(`--${name} takes a number, not ${argv[i + 1]}`);
  }
  return out;
}

// -- arrays on the wire: raw little-endian bytes with a dtype name and a shape ----------------------
function array(dtype, shape, typed) {
  return { dtype, shape, data: Buffer.from(typed.buffer, typed.byteOffset, typed.byteLength) };
}

function actionsOf(msg, numEnvs) {
  if (!msg) throw new Failure(grpc.status.INVALID_ARGUMENT, 'the request has no actions');
  const Type = INTEGERS[msg.dtype];
  if (!Type) throw new Failure(grpc.status.INVALID_ARGUMENT, `actions must be integers for a discrete space, got dtype '${String(msg.dtype).slice(0, 32)}'`);
  const shape = msg.shape.map(Number);
  if (shape.length !== 1 || shape[0] !== numEnvs) {
    throw new Failure(grpc.status.INVALID_ARGUMENT, `actions must have shape [${numEnvs}], got [${shape.slice(0, 8)}]`);
  }
  if (msg.data.length !== numEnvs * Type.BYTES_PER_ELEMENT) {
    throw new Failure(grpc.status.INVALID_ARGUMENT, `${msg.data.length} bytes do not hold a ${msg.dtype} array of shape [${shape}]`);
  }
  const copy = new Uint8Array(msg.data);  // typed arrays need aligned memory
  const actions = Array.from(new Type(copy.buffer, 0, numEnvs), Number);
  if (actions.some((a) => !(a >= 0 && a < ACTIONS))) {
    throw new Failure(grpc.status.INVALID_ARGUMENT, `actions out of bounds [0, ${ACTIONS - 1}]`);
  }
  return actions;
}

function box(values) {
  return array('float32', [values.length], Float32Array.from(values));
}

const INFO = (numEnvs) => ({
  env_id: ENV_ID,
  num_envs: numEnvs,
  observation_space: { kind: 'box', shape: [4], dtype: 'float32', low: box(OBS_HIGH.map((h) => -h)), high: box(OBS_HIGH) },
  action_space: { kind: 'discrete', shape: [], dtype: 'int64', n: ACTIONS, start: 0 },
});

// -- the service ---------------------------------------------------------------------------------
class EnvService {
  constructor(opts, token) {
    this.opts = opts;
    this.token = token;
    this.info = INFO(opts['num-envs']);
    this.sessions = new Map();
    setInterval(() => this.reap(), Math.min(5000, (opts['session-timeout-s'] * 1000) / 4)).unref();
  }

  authorize(call) {
    if (this.token === null) return;
    const given = Buffer.from(String(call.metadata.get('authorization')[0] || ''));
    const expected = Buffer.from(`Bearer ${this.token}`);
    if (given.length !== expected.length || !crypto.timingSafeEqual(given, expected)) {
      throw new Failure(grpc.status.UNAUTHENTICATED, 'missing or wrong bearer token');
    }
  }

  envId(requested) {
    if (requested && requested !== ENV_ID) {
      throw new Failure(grpc.status.NOT_FOUND, `environment '${requested.slice(0, 100)}' is not served here; served: ${ENV_ID}`);
    }
  }

  session(key) {
    const s = this.sessions.get(key);
    if (!s) throw new Failure(grpc.status.NOT_FOUND, 'unknown or expired session: open a new one');
    s.lastUsed = Date.now();
    return s;
  }

  reap() {
    const limit = Date.now() - this.opts['session-timeout-s'] * 1000;
    for (const [key, s] of this.sessions) if (s.lastUsed < limit) this.sessions.delete(key);
  }

  Describe(req) {
    this.envId(req.env_id);
    return this.info;
  }

  Open(req) {
    this.envId(req.env_id);
    if (this.sessions.size >= this.opts['max-sessions']) {
      this.reap();
      if (this.sessions.size >= this.opts['max-sessions']) {
        throw new Failure(grpc.status.RESOURCE_EXHAUSTED, `server holds its maximum of ${this.opts['max-sessions']} sessions; close one or retry later`);
      }
    }
    const key = crypto.randomUUID().replace(/-/g, '');
    const envs = Array.from({ length: this.opts['num-envs'] }, () => new CartPole(this.opts['max-episode-steps']));
    this.sessions.set(key, { envs, needsReset: true, lastUsed: Date.now() });
    return { session: key, info: this.info };
  }

  Reset(req) {
    const s = this.session(req.session);
    let seed;
    if (req._seed === 'seed') {  // proto3 optional: set
      seed = BigInt(req.seed);
      if (seed < 0n) throw new Failure(grpc.status.INVALID_ARGUMENT, `seed must be 0 or more, got ${seed}`);
    }
    const obs = new Float32Array(4 * s.envs.length);
    s.envs.forEach((env, i) => obs.set(env.reset(seed === undefined ? undefined : Number((seed + BigInt(i)) % 4294967296n)), 4 * i));
    s.needsReset = false;
    return { obs: array('float32', [s.envs.length, 4], obs), info: {} };
  }

  Step(req) {
    const s = this.session(req.session);
    const n = s.envs.length;
    const actions = actionsOf(req.actions, n);
    if (s.needsReset) throw new Failure(grpc.status.FAILED_PRECONDITION, 'call Reset before the first Step');
    const obs = new Float32Array(4 * n);
    const final = new Float32Array(4 * n);
    const rewards = new Float64Array(n);
    const terminated = new Uint8Array(n);
    const truncated = new Uint8Array(n);
    s.envs.forEach((env, i) => {
      const r = env.step(actions[i]);
      rewards[i] = r.reward;
      terminated[i] = r.terminated;
      truncated[i] = r.truncated;
      if (r.terminated || r.truncated) {
        final.set(r.obs, 4 * i);
        obs.set(env.reset(), 4 * i);
      } else {
        obs.set(r.obs, 4 * i);
      }
    });
    return { obs: array('float32', [n, 4], obs), rewards: array('float64', [n], rewards),
      terminated: array('bool', [n], terminated), truncated: array('bool', [n], truncated),
      final_obs: array('float32', [n, 4], final), info: {} };
  }

  Close(req) {
    this.sessions.delete(req.session);
    return {};
  }

  // One unary method: checks, then the handler; a Failure becomes the call's status.
  unary(name) {
    return (call, callback) => {
      try {
        this.authorize(call);
        if (call.request.malformed) throw new Failure(grpc.status.INVALID_ARGUMENT, `malformed request: ${call.request.malformed}`);
        callback(null, this[name](call.request));
      } catch (e) {
        callback(e instanceof Failure ? e : { code: grpc.status.INTERNAL, details: String(e) });
      }
    };
  }

  // StepStream: one reply per request, in order; a request that fails ends the stream with its status.
  stream() {
    return (call) => {
      let failed = false;
      const fail = (e) => {
        failed = true;
        call.emit('error', e instanceof Failure ? e : { code: grpc.status.INTERNAL, details: String(e) });
      };
      try {
        this.authorize(call);
      } catch (e) {
        fail(e);
        return;
      }
      call.on('data', (req) => {
        if (failed) return;
        try {
          if (req.malformed) throw new Failure(grpc.status.INVALID_ARGUMENT, `malformed request: ${req.malformed}`);
          call.write(this.Step(req));
        } catch (e) {
          fail(e);
        }
      });
      call.on('end', () => failed || call.end());
    };
  }
}

// Requests are parsed here rather than by grpc-js, whose failure would be INTERNAL: malformed
// bytes get INVALID_ARGUMENT with the reason, as shoal's servers answer them.
function lenient(service) {
  const out = {};
  for (const [name, method] of Object.entries(service)) {
    out[name] = { ...method, requestDeserialize: (bytes) => {
      try {
        return method.requestDeserialize(bytes);
      } catch (e) {
        return { malformed: e.message };
      }
    } };
  }
  return out;
}

function isLoopback(host) {
  const h = host.replace(/^\[|\]$/g, '');
  return h === 'localhost' || (net.isIPv4(h) && h.startsWith('127.')) || h === '::1';
}

function main() {
  const opts = options(process.argv.slice(2));
  const token = opts['token-file'] ? fs.readFileSync(opts['token-file'], 'utf8').trim() : (process.env.SHOAL_TOKEN || null);
  if (token !== null && token.length < 16) throw new Error('the token is too short: use at least 16 characters');
  if (!isLoopback(opts.host) && token === null) {
    throw new Error(`binding ${opts.host} exposes the server beyond this machine: give it a token (--token-file or SHOAL_TOKEN), or bind 127.0.0.1`);
  }
  const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true });
  const bytes = opts['max-message-mb'] * 1024 * 1024;
  const server = new grpc.Server({ 'grpc.max_receive_message_length': bytes, 'grpc.max_send_message_length': bytes });
  const service = new EnvService(opts, token);
  const handlers = { StepStream: service.stream() };
  for (const name of ['Describe', 'Open', 'Reset', 'Step', 'Close']) handlers[name] = service.unary(name);
  server.addService(lenient(grpc.loadPackageDefinition(definition).shoal.v1.EnvService.service), handlers);
  new HealthImplementation({ '': 'SERVING', 'shoal.v1.EnvService': 'SERVING' }).addToServer(server);  // no token
  const host = net.isIPv6(opts.host) ? `[${opts.host}]` : opts.host;
  server.bindAsync(`${host}:${opts.port}`, grpc.ServerCredentials.createInsecure(), (err, port) => {
    if (err) {
      console.error(`error: cannot listen on ${host}:${opts.port}: ${err.message}`);
      process.exit(1);
    }
    console.log(`serving ${ENV_ID} (${opts['num-envs']} envs per session) on ${host}:${port}`);
  });
  const stop = () => {  // calls in flight get a second to finish; open streams are then cut
    server.tryShutdown(() => process.exit(0));
    setTimeout(() => process.exit(0), 1000).unref();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

try {
  main();
} catch (e) {
  console.error(`error: ${e.message}`);
  process.exit(2);
}
