"""A stand-in `torch` for the recording tests on a machine without CUDA: it records the calls the
package makes and writes a fabricated snapshot (the repository's sample) where PyTorch would."""
import shutil
import types


class FakeTorch(types.ModuleType):
    def __init__(self, sample, cuda=True, version="2.11.0+cu130", hook_loads=True, legacy=False,
                 hook_starts=True, lazy=False):
        super().__init__("torch")
        self.__version__ = version
        self.calls = []
        self.observers = []
        self.history_on = False  # what torch._C._cuda_isHistoryEnabled() reports
        self.queued = []  # lazy: the calls torch.cuda._lazy_call queued until init
        self.initialized = False
        self.version = types.SimpleNamespace(cuda="13.0" if cuda else None)
        fake = self

        def record_history(*args, **kw):
            if legacy and "max_entries" in kw:  # torch 2.0's signature has no max_entries
                raise TypeError("_record_memory_history() got an unexpected keyword argument")
            fake.calls.append(("_record_memory_history", args, kw))
            enabled = args[0] if args else kw.get("enabled", "all")
            fake.history_on = enabled not in (None, False)

        def dump(path):
            fake.calls.append(("_dump_snapshot", path))
            shutil.copyfile(sample, path)

        def load_library(path):
            fake.calls.append(("load_library", str(path)))
            if not hook_loads:
                raise OSError("undefined symbol: _ZN3c104cuda20CUDACachingAllocator")

        memory = types.SimpleNamespace(_record_memory_history=record_history, _dump_snapshot=dump)
        def init():
            fake.calls.append(("init",))
            if not fake.initialized:  # as torch.cuda._lazy_init: the queued calls, once
                fake.initialized = True
                for call in fake.queued:
                    call()

        self.cuda = types.SimpleNamespace(is_available=lambda: cuda, memory=memory, init=init)
        if lazy:  # torch.cuda's lazy initialisation, which `run` waits for
            self.cuda.is_initialized = lambda: fake.initialized
            self.cuda._lazy_call = lambda fn: fn() if fake.initialized else fake.queued.append(fn)
        self._C = types.SimpleNamespace(
            _cuda_attach_out_of_memory_observer=lambda fn: fake.observers.append(fn),
            _cuda_isHistoryEnabled=self._is_history_enabled)
        self.ops = types.SimpleNamespace(
            load_library=load_library,
            memforensics=types.SimpleNamespace(  # the hook's ops return whether they succeeded
                start=lambda *a: fake.calls.append(("hook.start", a)) or hook_starts,
                stop=lambda: fake.calls.append(("hook.stop",)) or True))

    def _is_history_enabled(self):
        # PyTorch's reads the current device's allocator, which exists only after CUDA's init.
        if not self.initialized:
            raise RuntimeError("fake torch: _cuda_isHistoryEnabled before torch.cuda.init()")
        return self.history_on
