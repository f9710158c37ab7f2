"""The demo model trained by a plain PyTorch loop, on one device: what runtime_loop.py runs on any strategy."""

import torch
from torch.nn import functional
from torch.utils.data import DataLoader

from stratagem.demo import DemoModule, make_classification


def train(samples=2048, batch_size=32, seed=1234):
    torch.manual_seed(seed)
    loader = DataLoader(make_classification(samples), batch_size=batch_size)
    model = DemoModule()
    model.configure_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=model.learning_rate, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(loader))
    losses = []
    for features, labels in loader:
        loss = functional.cross_entropy(model(features), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    losses = train()
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
