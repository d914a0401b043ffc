"""The tools a generated project is built and tested with: compiler, pip, pytest (`build`) and the
conformance suite's runner (`conformance`)."""
