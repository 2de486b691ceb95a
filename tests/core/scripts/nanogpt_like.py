"""A tiny stand-in for pytorch/examples' or nanoGPT's training script of that name: its
shape of loop (losses, updates, evaluation) on synthetic data, for hookwrap trace."""
import argparse
import torch
import torch.nn as nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--max_iters", type=int, default=6)
parser.add_argument("--eval_interval", type=int, default=3)
parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
args = parser.parse_args()
torch.manual_seed(0)


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)

    def forward(self, idx, targets=None):
        logits = self.head(self.emb(idx))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, 16), targets.view(-1))
        return logits, loss


def get_batch(split):
    g = torch.Generator().manual_seed(len(split) * 1000 + iter_num)
    x = torch.randint(0, 16, (4, 6), generator=g)
    return x, torch.roll(x, -1, 1)


model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
iter_num = 0


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(2)
        for k in range(2):
            X, Y = get_batch(split)
            logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


X, Y = get_batch("train")
while True:
    if iter_num % args.eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    for micro_step in range(args.gradient_accumulation_steps):
        logits, loss = model(X, Y)
        print(f"micro {loss.item()}")
        loss = loss / args.gradient_accumulation_steps
        X, Y = get_batch("train")
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num > args.max_iters:
        break
