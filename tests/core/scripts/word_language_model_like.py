"""A tiny stand-in for pytorch/examples' or nanoGPT's training script of that name: its
shape of loop (losses, updates, evaluation) on synthetic data, for hookwrap trace."""
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.LogSoftmax(dim=-1))
criterion = nn.NLLLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(8, 8), torch.randint(0, 4, (8,))) for _ in range(5)]
val_data = [(torch.randn(8, 8), torch.randint(0, 4, (8,))) for _ in range(2)]
test_data = [(torch.randn(8, 8), torch.randint(0, 4, (8,))) for _ in range(2)]

def get_batch(source, i):
    return source[i]

def evaluate(data_source):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(len(data_source)):
            x, y = get_batch(data_source, i)
            total += criterion(model(x), y).item()
    return total / len(data_source)

def train():
    model.train()
    for i in range(len(data)):
        x, y = get_batch(data, i)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        print(f"loss {loss.item()}")

for epoch in range(args.epochs):
    train()
    val_loss = evaluate(val_data)
    print(f"val {val_loss}")
# As word_language_model ends: the test set, evaluated by the same function.
test_loss = evaluate(test_data)
print(f"test {test_loss}")
