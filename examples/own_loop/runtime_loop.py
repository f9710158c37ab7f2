"""raw_loop.py on two ranks of ddp; any other registered strategy is one name away (see docs/own-loop.md)."""

import torch
from torch.nn import functional
from torch.utils.data import DataLoader

import stratagem
from stratagem.demo import DemoModule, make_classification


def train(runtime, samples=2048, batch_size=32, seed=1234):
    torch.manual_seed(seed)
    loader = runtime.setup_dataloaders(DataLoader(make_classification(samples), batch_size=batch_size))
    model = DemoModule()
    model.configure_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=model.learning_rate, weight_decay=0.01)
    model, optimizer = runtime.setup(model, optimizer)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(loader))
    losses = []
    for features, labels in loader:
        loss = functional.cross_entropy(model(features), labels)
        runtime.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    runtime = stratagem.Runtime(strategy="ddp", accelerator="cpu", devices=2)
    losses = runtime.launch(train)
    runtime.print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
