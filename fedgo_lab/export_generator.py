"""Write a trained generator in the portable generator-file format (fedgo_app.generators), for
`generator-source = "load"`: an off-the-shelf G (FedGO's G2) that another run, another
dataset split or another user trained.

    python -m fedgo_lab.export_generator SOURCE DEST.pt

SOURCE is an entry of a generator cache (<results-dir>/generators/generator-*.pt, written by
every run that trained G on U) or a generator file already. The image shape comes from the
entry's description (U's shape); the file records it with the architecture's arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from fedgo_app.generators import FORMAT, load_generator_file, save_generator_file
from fedgo_flwr.models import Generator


def export(source: Path, dest: Path) -> Path:
    entry = torch.load(source, map_location="cpu", weights_only=True)
    if isinstance(entry, dict) and entry.get("format") == FORMAT:  # already portable
        generator = load_generator_file(source, tuple(entry["image_shape"]))
        return save_generator_file(dest, generator, entry["image_shape"][0])
    try:
        description, state = entry["description"], entry["state"]
        _, channels, side, _ = description["u_shape"]
        generator = Generator(description["latent_dim"], channels, side,
                              description["generator_width"])
        generator.load_state_dict(state)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise SystemExit(f"[export] {source} is neither a generator-cache entry nor a "
                         f"generator file ({err})") from None
    return save_generator_file(dest, generator, channels)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.export_generator",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a generator-cache entry or generator file")
    parser.add_argument("dest", type=Path, help="the generator file to write")
    args = parser.parse_args(argv)
    path = export(args.source, args.dest)
    print(f"[export] wrote {path}; use it with generator-source = \"load\" generator-file = "
          f"\"{path.resolve()}\"")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
