// The simulator, once trained on, plays with the trained policy: it asks `shoal serve-policy`
// for each step's action over one ActStream (PolicyService in proto/shoal.proto), as a game or a
// robot's controller would, and prints one JSON line: episodes, their mean return, the policy's
// version.
//
//   shoal serve-policy RUN_DIR --port 50061 &
//   node play.js 127.0.0.1:50061 [--episodes 5] [--seed 0]
//
// SHOAL_TOKEN, when set, is sent as the bearer token.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { CartPole } = require('./cartpole');

const PROTO = path.join(__dirname, '..', '..', 'proto', 'shoal.proto');

function describe(client, metadata) {
  return new Promise((resolve, reject) => {
    client.Describe({}, metadata, { deadline: Date.now() + 10000 }, (err, info) => (err ? reject(err) : resolve(info)));
  });
}

// A stream whose replies are awaited one request at a time.
function actStream(client, metadata) {
  const call = client.ActStream(metadata);
  const waiting = [];
  let failure = null;
  call.on('data', (reply) => waiting.shift().resolve(reply));
  call.on('error', (err) => {
    failure = err;
    while (waiting.length) waiting.shift().reject(err);
  });
  return {
    act(obs) {
      if (failure) return Promise.reject(failure);
      return new Promise((resolve, reject) => {
        waiting.push({ resolve, reject });
        const data = Buffer.from(Float32Array.from(obs).buffer);
        call.write({ obs: { dtype: 'float32', shape: [obs.length], data }, deterministic: true });
      });
    },
    end: () => call.end(),
  };
}

function actionOf(reply) {
  const { dtype, data } = reply.actions;
  const bytes = new Uint8Array(data);  // a copy: typed arrays need aligned memory
  if (dtype === 'int64') return Number(new BigInt64Array(bytes.buffer)[0]);
  if (dtype === 'int32') return new Int32Array(bytes.buffer)[0];
  throw new Error(`the policy gave actions of dtype ${dtype}, where CartPole takes integers`);
}

async function main() {
  const args = process.argv.slice(2);
  const address = args[0];
  const opt = (name, dflt) => (args.includes(name) ? Number(args[args.indexOf(name) + 1]) : dflt);
  const episodes = opt('--episodes', 5);
  const seed = opt('--seed', 0);
  if (!address) throw new Error('usage: node play.js HOST:PORT [--episodes N] [--seed S]');

  const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: String, enums: String, defaults: true });
  const shoal = grpc.loadPackageDefinition(definition).shoal.v1;
  const client = new shoal.PolicyService(address, grpc.credentials.createInsecure());
  const metadata = new grpc.Metadata();
  if (process.env.SHOAL_TOKEN) metadata.add('authorization', `Bearer ${process.env.SHOAL_TOKEN}`);

  const info = await describe(client, metadata);
  const obsShape = info.observation_space.shape.map(Number);
  if (info.action_space.kind !== 'discrete' || obsShape.length !== 1 || obsShape[0] !== 4) {
    throw new Error(`the policy takes ${info.observation_space.kind} ${JSON.stringify(obsShape)} observations and gives `
      + `${info.action_space.kind} actions: it was not trained on CartPole`);
  }
  const stream = actStream(client, metadata);
  const returns = [];
  let version = null;
  for (let e = 0; e < episodes; e++) {
    const env = new CartPole();
    let obs = env.reset(seed + e);
    let total = 0;
    for (;;) {
      const reply = await stream.act(obs);
      version = Number(reply.version);
      const r = env.step(actionOf(reply));
      total += r.reward;
      obs = r.obs;
      if (r.terminated || r.truncated) break;
    }
    returns.push(total);
  }
  stream.end();
  client.close();
  console.log(JSON.stringify({ episodes, mean_return: returns.reduce((a, b) => a + b, 0) / episodes, returns, version }));
}

main().catch((err) => {
  console.error(`error: ${err.details || err.message}`);
  process.exit(1);
});
