"""The engine: IR -> steps -> specialised plan -> generated code -> arrays, on every backend."""
