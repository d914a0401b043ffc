"""Entry point of the `torch.backends` group: `import torch` loads {{ cookiecutter.package }} through it.

It lives outside the package so that a backend which cannot load (a build for another torch, a
corrupt library) is reported as a warning instead of breaking `import torch` for every program in
the environment. TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns autoloading off.
"""

import warnings


def load() -> None:
    try:
        import {{ cookiecutter.package }}  # noqa: F401  (registers the backend)
    except Exception as e:  # reported, not raised: torch must stay importable
        if getattr(e, "self_explanatory", False):  # _torch_match.TorchMismatch: it says what to do
            warnings.warn(
                f"the {{ cookiecutter.device }} backend ({{ cookiecutter.package }}) is disabled: {e}. "
                "TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns autoloading off.",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        warnings.warn(
            f"the {{ cookiecutter.device }} backend ({{ cookiecutter.package }}) failed to load and is disabled: {e}. "
            "Rebuild it (pip install --no-build-isolation -e .) or run `backendgen check`; "
            "TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns autoloading off.",
            RuntimeWarning,
            stacklevel=2,
        )
