// Gymnasium's CartPole-v1 written again in JavaScript: the simulator that server.js serves for
// training and play.js drives with a trained policy.
//
// The dynamics, bounds, rewards and start states are those of gymnasium/envs/classic_control/
// cartpole.py (Barto, Sutton and Anderson 1983, Euler integration), so a policy trained on
// either acts the same on the other. The state is held in float64 and observed as float32, as
// there. Episodes are truncated after maxEpisodeSteps (500: CartPole-v1's TimeLimit).
'use strict';

const GRAVITY = 9.8;
const MASS_CART = 1.0;
const MASS_POLE = 0.1;
const TOTAL_MASS = MASS_CART + MASS_POLE;
const HALF_LENGTH = 0.5;  // half the pole's length
const POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH;
const FORCE = 10.0;
const TAU = 0.02;  // seconds between state updates
const THETA_LIMIT = (12 * 2 * Math.PI) / 360;
const X_LIMIT = 2.4;

// Observations may go twice as far as the limits that end an episode (velocities are unbounded).
const OBS_HIGH = [X_LIMIT * 2, Infinity, THETA_LIMIT * 2, Infinity];

function mulberry32(seed) {  // a small seeded generator of uniforms in [0, 1)
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

class CartPole {
  constructor(maxEpisodeSteps = 500) {
    this.maxEpisodeSteps = maxEpisodeSteps;
    this.random = mulberry32((Math.random() * 4294967296) >>> 0);
    this.state = [0, 0, 0, 0];
    this.steps = 0;
  }

  // A new episode: every state variable uniform in (-0.05, 0.05). A seed restarts the generator.
  reset(seed) {
    if (seed !== undefined) this.random = mulberry32(seed >>> 0);
    this.state = this.state.map(() => -0.05 + 0.1 * this.random());
    this.steps = 0;
    return this.state;
  }

  // action 1 pushes the cart right, 0 left; the reward is 1 for every step, the last included.
  step(action) {
    const [x, xDot, theta, thetaDot] = this.state;
    const force = action === 1 ? FORCE : -FORCE;
    const cos = Math.cos(theta);
    const sin = Math.sin(theta);
    const temp = (force + POLE_MASS_LENGTH * thetaDot * thetaDot * sin) / TOTAL_MASS;
    const thetaAcc = (GRAVITY * sin - cos * temp) / (HALF_LENGTH * (4.0 / 3.0 - (MASS_POLE * cos * cos) / TOTAL_MASS));
    const xAcc = temp - (POLE_MASS_LENGTH * thetaAcc * cos) / TOTAL_MASS;
    this.state = [x + TAU * xDot, xDot + TAU * xAcc, theta + TAU * thetaDot, thetaDot + TAU * thetaAcc];
    this.steps += 1;
    const [nx, , nTheta] = this.state;
    const terminated = nx < -X_LIMIT || nx > X_LIMIT || nTheta < -THETA_LIMIT || nTheta > THETA_LIMIT;
    const truncated = !terminated && this.steps >= this.maxEpisodeSteps;
    return { obs: this.state, reward: 1.0, terminated, truncated };
  }
}

module.exports = { CartPole, OBS_HIGH, ACTIONS: 2 };
