"""The demo's server-side decode phase: PNGs ingested as they are, decoded, cropped and normalised by
the fleet (`image.decode`), a small CNN trained on the batches — the trainer decodes nothing."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

__all__ = ["image_phase", "make_images"]

IMAGE_CLASSES = ("red", "green", "blue", "yellow")
IMAGE_SIDE = 32


def make_images(src: Path, per_class: int, seed: int = 0) -> None:
    """PNG files in src/<colour>/: a noisy background with a rectangle of the class's colour."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    colours = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (40, 60, 220), "yellow": (230, 220, 40)}
    for name in IMAGE_CLASSES:
        (src / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = (int(v) for v in rng.integers(40, 72, 2))
            img = Image.fromarray(rng.integers(0, 140, (h, w, 3), dtype=np.uint8))
            x0, y0 = int(rng.integers(0, w // 3)), int(rng.integers(0, h // 3))
            ImageDraw.Draw(img).rectangle((x0, y0, x0 + w // 2, y0 + h // 2), fill=colours[name])
            img.save(src / name / f"{i:04d}.png")


def image_phase(work: Path, root: Path, endpoints: str) -> bool:
    import torch

    from shardstream.client import Loader
    from shardstream.server.writing.ingest import IngestOptions, ingest

    src = work / "images"
    make_images(src, per_class=96)
    m = ingest(src, "shapes", root, IngestOptions(row_group_rows=64, progress=False))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, len(IMAGE_CLASSES)),
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    decode = {
        "op": "image.decode",
        "column": "image",
        "size": [IMAGE_SIDE, IMAGE_SIDE],
        "layout": "CHW",
        "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
    }
    train = [{**decode, "crop": "random", "hflip": True}]
    cpu0 = time.process_time()
    with Loader(
        endpoints.split(","),
        m.ref,
        batch_size=32,
        epochs=4,
        seed=1,
        columns=["image", "label"],
        transforms=train,
        output="torch",
    ) as loader:
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["image"]), batch["label"].long())
            opt.zero_grad()
            loss.backward()
            opt.step()
            shape = tuple(batch["image"].shape)
    correct = 0
    with (
        torch.no_grad(),
        Loader(
            endpoints.split(","),
            m.ref,
            batch_size=64,
            shuffle=False,
            columns=["image", "label"],
            transforms=[decode],
            output="torch",
        ) as loader,
    ):
        for batch in loader:
            correct += int((model(batch["image"]).argmax(1) == batch["label"].long()).sum())
    accuracy = correct / m.num_rows
    print(
        f"8. server-side decode: {m.num_rows} PNGs as {m.ref}; the fleet decoded, cropped and normalised them "
        f"(image.decode) into float32 batches of {list(shape)}; a small CNN trained 4 epochs on them "
        f"(trainer CPU {time.process_time() - cpu0:.1f} s, no image decoded here): accuracy {accuracy:.1%}"
    )
    return accuracy > 0.5
