"""Console entry point `mooncake_cxl_master`: runs the C++ master shipped in the package."""
import os
import sys
from pathlib import Path


def binary_path() -> str:
    return str(Path(__file__).resolve().parent / "bin" / "mooncake_cxl_master")


def main() -> None:
    path = binary_path()
    if not os.access(path, os.X_OK):
        sys.exit(f"mooncake_cxl_master binary not found at {path}; reinstall the package")
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
