// Drive a shoal env server from Node.js, knowing nothing but proto/shoal.proto.
//
//   node client.js HOST:PORT [--steps N] [--seed S]
//
// Opens a session, resets with a seed, takes random actions drawn from the action space the
// server describes, and prints one JSON line: env id, envs, steps, finished episodes and their
// mean return. SHOAL_TOKEN, when set, is sent as the bearer token.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO = path.join(__dirname, '..', '..', 'proto', 'shoal.proto');
const TYPES = {
  float32: [Float32Array, 4], float64: [Float64Array, 8], int32: [Int32Array, 4], int64: [BigInt64Array, 8],
  uint8: [Uint8Array, 1], bool: [Uint8Array, 1],
};

function decode(array) {
  const [Type, size] = TYPES[array.dtype];
  const bytes = Buffer.from(array.data);  // copy: typed arrays need aligned memory
  const values = new Type(bytes.buffer, bytes.byteOffset, bytes.length / size);
  return { shape: array.shape.map(Number), values: Array.from(values, Number) };
}

function encode(dtype, shape, values) {
  const [Type] = TYPES[dtype];
  const typed = Type === BigInt64Array ? BigInt64Array.from(values, (v) => BigInt(v)) : Type.from(values);
  return { dtype, shape, data: Buffer.from(typed.buffer) };
}

function randomActions(space, numEnvs, rng) {
  const perEnv = space.shape.map(Number).reduce((a, b) => a * b, 1);
  const values = [];
  if (space.kind === 'discrete') {
    for (let i = 0; i < numEnvs; i++) values.push(Number(space.start) + Math.floor(rng() * Number(space.n)));
    return encode('int64', [numEnvs], values);
  }
  if (space.kind === 'box') {
    const low = decode(space.low).values;
    const high = decode(space.high).values;
    for (let i = 0; i < numEnvs; i++) {
      for (let j = 0; j < perEnv; j++) values.push(low[j] + rng() * (high[j] - low[j]));
    }
    return encode(space.dtype === 'float64' ? 'float64' : 'float32', [numEnvs, ...space.shape.map(Number)], values);
  }
  throw new Error(`this example handles discrete and box action spaces, not ${space.kind}`);
}

function mulberry32(seed) {  // a small seeded generator, so runs repeat
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function call(client, method, request, metadata) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata, { deadline: Date.now() + 10000 }, (err, reply) => (err ? reject(err) : resolve(reply)));
  });
}

async function main() {
  const args = process.argv.slice(2);
  const address = args[0];
  const opt = (name, dflt) => (args.includes(name) ? Number(args[args.indexOf(name) + 1]) : dflt);
  const steps = opt('--steps', 500);
  const seed = opt('--seed', 0);
  if (!address) throw new Error('usage: node client.js HOST:PORT [--steps N] [--seed S]');

  const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: String, enums: String, defaults: true });
  const shoal = grpc.loadPackageDefinition(definition).shoal.v1;
  const client = new shoal.EnvService(address, grpc.credentials.createInsecure());
  const metadata = new grpc.Metadata();
  if (process.env.SHOAL_TOKEN) metadata.add('authorization', `Bearer ${process.env.SHOAL_TOKEN}`);

  const opened = await call(client, 'Open', {}, metadata);
  const { session } = opened;
  const numEnvs = opened.info.num_envs;
  await call(client, 'Reset', { session, seed }, metadata);
  const rng = mulberry32(seed);
  const running = new Array(numEnvs).fill(0);
  const returns = [];
  for (let t = 0; t < steps; t++) {
    const reply = await call(client, 'Step', { session, actions: randomActions(opened.info.action_space, numEnvs, rng) }, metadata);
    const rewards = decode(reply.rewards).values;
    const terminated = decode(reply.terminated).values;
    const truncated = decode(reply.truncated).values;
    for (let i = 0; i < numEnvs; i++) {
      running[i] += rewards[i];
      if (terminated[i] || truncated[i]) {
        returns.push(running[i]);
        running[i] = 0;
      }
    }
  }
  await call(client, 'Close', { session }, metadata);
  grpc.Client.prototype.close.call(client);  // client.close is the Close RPC's alias here
  const mean = returns.length ? returns.reduce((a, b) => a + b, 0) / returns.length : null;
  console.log(JSON.stringify({ env_id: opened.info.env_id, num_envs: numEnvs, steps: steps * numEnvs,
    episodes: returns.length, mean_return: mean }));
}

main().catch((err) => {
  console.error(`error: ${err.details || err.message}`);
  if (process.env.DEBUG) console.error(err.stack);
  process.exit(1);
});
