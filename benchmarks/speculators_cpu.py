"""``speculators`` (0.9.0) on a machine with no accelerator: its CLI, with the four places where
its trainer assumes one patched from outside its package (nothing in site-packages is changed).

1. ``Trainer`` moves the model and every batch to ``get_local_rank()`` (0: ``cuda:0``) -> "cpu";
2. ``Trainer.device_type`` falls back to ``"cuda"`` for autocast -> ``"cpu"``;
3. the checkpointer's ``get_current_device()`` returns ``"cuda:0"`` -> ``"cpu"``;
4. ``torch.accelerator.synchronize()`` (the step timer, at every logged step) raises with no
   accelerator -> a no-op there.

Run it with the flags CPU training needs (``--draft-attn-impl sdpa`` (flex attention's block
mask is CUDA's), ``--loss-implementation eager``, ``--num-workers 0``) and ``--on-missing raise``
(otherwise a sample with no hidden-state file is sent to a vLLM endpoint):

    .venv/bin/python benchmarks/speculators_cpu.py train --verifier-name-or-path FOLDER \\
        --data-path HS --save-path OUT --draft-attn-impl sdpa --loss-implementation eager \\
        --num-workers 0 --on-missing raise --epochs 1
"""

from __future__ import annotations

import sys


def patch() -> None:
    import torch
    from speculators.train import checkpointer, trainer

    if torch.accelerator.is_available():
        return  # an accelerator: nothing to patch
    trainer.get_local_rank = lambda: "cpu"  # type: ignore[assignment]
    checkpointer.get_current_device = lambda: "cpu"  # type: ignore[assignment]
    init = trainer.Trainer.__init__

    def cpu_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        init(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer.Trainer.__init__ = cpu_init  # type: ignore[method-assign]
    torch.accelerator.synchronize = lambda *a, **k: None  # type: ignore[assignment]


def main() -> None:
    patch()
    from speculators.cli import app

    sys.argv = ["speculators", *sys.argv[1:]]
    app()


if __name__ == "__main__":
    main()
