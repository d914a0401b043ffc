"""Print the names `torch.<name>` has, as a JSON list (naming.torch_attribute_names)."""

import json


def main() -> None:
    import torch

    print(json.dumps(sorted(dir(torch))))


if __name__ == "__main__":
    main()
