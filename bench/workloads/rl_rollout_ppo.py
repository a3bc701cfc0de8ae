"""RL rollouts and PPO updates: 32 vectorised toy environments (observation 64), a GRU policy (hidden 256) with actor
(18 actions) and critic heads; 3 iterations of a 128-step rollout (per-step tensors appended to a buffer) then
generalised advantage estimation and 4 PPO epochs over 4 shuffled minibatches of the flattened batch."""
import torch
from torch import nn

torch.manual_seed(6)
torch.set_num_threads(1)
E, T, OBS, H, A = 32, 128, 64, 256, 18


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.gru = nn.Sequential(nn.Linear(OBS, H), nn.Tanh()), nn.GRUCell(H, H)
        self.actor, self.critic = nn.Linear(H, A), nn.Linear(H, 1)

    def forward(self, obs, h):
        h = self.gru(self.enc(obs), h)
        return self.actor(h), self.critic(h).squeeze(-1), h


pol = Policy()
opt = torch.optim.Adam(pol.parameters(), 3e-4)
proj = torch.randn(A, OBS) * 0.1
obs, h = torch.randn(E, OBS), torch.zeros(E, H)
for _ in range(3):
    buf = {k: [] for k in ("obs", "h", "act", "logp", "val", "rew", "done")}
    with torch.no_grad():
        for _ in range(T):
            logits, val, h_new = pol(obs, h)
            dist = torch.distributions.Categorical(logits=logits)
            act = dist.sample()
            for k, v in (("obs", obs), ("h", h), ("act", act), ("logp", dist.log_prob(act)), ("val", val)):
                buf[k].append(v)
            rew = (act % 3 == 0).float() - 0.1
            done = torch.rand(E) < 0.02
            obs = 0.9 * obs + proj[act] + 0.1 * torch.randn(E, OBS)
            obs[done] = torch.randn(int(done.sum()), OBS)
            h = h_new * (~done)[:, None]
            buf["rew"].append(rew)
            buf["done"].append(done.float())
        batch = {k: torch.stack(v) for k, v in buf.items()}
        adv, last = torch.zeros(T, E), torch.zeros(E)
        nxt = pol(obs, h)[1]
        for t in reversed(range(T)):
            delta = batch["rew"][t] + 0.99 * nxt * (1 - batch["done"][t]) - batch["val"][t]
            last = delta + 0.99 * 0.95 * (1 - batch["done"][t]) * last
            adv[t], nxt = last, batch["val"][t]
        ret = adv + batch["val"]
    flat = {k: v.reshape(T * E, *v.shape[2:]) for k, v in batch.items()}
    adv, ret = adv.reshape(-1), ret.reshape(-1)
    for _ in range(4):
        for idx in torch.randperm(T * E).chunk(4):
            logits, val, _ = pol(flat["obs"][idx], flat["h"][idx])
            dist = torch.distributions.Categorical(logits=logits)
            ratio = (dist.log_prob(flat["act"][idx]) - flat["logp"][idx]).exp()
            a = (adv[idx] - adv[idx].mean()) / (adv[idx].std() + 1e-8)
            loss = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a).mean() + 0.5 * (val - ret[idx]).pow(2).mean() \
                - 0.01 * dist.entropy().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
