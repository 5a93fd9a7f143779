"""A stand-in for tqdm, used only by ``workshop_lib.gpu_check --smoke`` where the real
package is missing (see ../README.md): the iterable, without a progress bar."""


class tqdm:  # noqa: N801 (the real package's name)
    def __init__(self, iterable=None, *args, **kwargs):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable)

    def __len__(self):
        return len(self.iterable)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass

    def set_postfix(self, *args, **kwargs):
        pass

    def close(self):
        pass
