"""A tiny stand-in for pytorch/examples' or nanoGPT's training script of that name: its
shape of loop (losses, updates, evaluation) on synthetic data, for hookwrap trace."""
import torch
import torch.nn as nn

torch.manual_seed(0)
netD = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())
netG = nn.Linear(2, 4)
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4)
optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-4)
for i in range(4):
    netD.zero_grad()
    real = torch.randn(8, 4)
    errD_real = criterion(netD(real), torch.ones(8, 1))
    errD_real.backward()
    fake = netG(torch.randn(8, 2))
    errD_fake = criterion(netD(fake.detach()), torch.zeros(8, 1))
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    errG = criterion(netD(fake), torch.ones(8, 1))
    errG.backward()
    optimizerG.step()
    print(f"losses {errD_real.item()} {errD_fake.item()} {errG.item()}")
