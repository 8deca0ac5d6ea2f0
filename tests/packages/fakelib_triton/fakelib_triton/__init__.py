"""A stand-in for a Triton library you do not own (tests/packages/fakelib_companion serves it)."""
