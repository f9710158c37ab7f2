"""Train the built-in demo model with any strategy, device and precision: the same job as `stratagem demo`.

    python examples/train.py                                   # CPU, one process
    python examples/train.py --strategy ddp --devices 2        # two CPU processes (needs stratagem-ddp)
    python examples/train.py --precision bf16-mixed --max-steps 200

It shows the whole API a user touches: a Module, a Trainer built from names, fit, and a
checkpoint to resume from (`--ckpt-path last`).
"""

import argparse

from stratagem import Trainer
from stratagem.demo import DemoModule, demo_dataloaders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", default="1")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--max-steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--root-dir", default="stratagem_demo")
    parser.add_argument("--ckpt-path", default=None, help="a checkpoint to resume from, or 'last'")
    args = parser.parse_args()

    # Every bad value (an unknown strategy, a precision the device lacks) fails here, before anything starts.
    trainer = Trainer(
        accelerator=args.accelerator,
        strategy=args.strategy,
        devices=args.devices,
        precision=args.precision,
        max_steps=args.max_steps,
        default_root_dir=args.root_dir,
        seed=0,
    )
    train_loader, val_loader = demo_dataloaders(batch_size=args.batch_size)
    module = DemoModule()
    trainer.fit(module, train_loader, val_loader, ckpt_path=args.ckpt_path)

    if trainer.is_global_zero:
        metrics = trainer.callback_metrics
        print(f"final train loss {float(metrics['train_loss']):.4f}, {trainer.throughput.steps_per_second:.1f} steps/s")
        if trainer.checkpoint_callback is not None:
            print(f"checkpoint: {trainer.checkpoint_callback.best_model_path}")


if __name__ == "__main__":
    main()
