"""A Dask worker preload that makes `ember` unimportable, as on a machine without it."""
import sys


class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name == "ember" or name.startswith("ember."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, _Missing())
for name in [n for n in sys.modules if n == "ember" or n.startswith("ember.")]:
    del sys.modules[name]
