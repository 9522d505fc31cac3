import sys, time, json, collections
sys.path.insert(0, "/tmp/old/tests")
from pathlib import Path
import test_big_output as T
from pipeline.judge import session as S, judge as J
acc = collections.defaultdict(float); cnt = collections.Counter()
def wrap(obj, name):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: acc[name] += time.perf_counter() - t; cnt[name] += 1
    setattr(obj, name, g)
for n in ("fetch", "values", "release", "discard", "ask"): wrap(S.Session, n)
wrap(J, "compare")
tmp = Path(sys.argv[1]); tmp.mkdir(parents=True, exist_ok=True)
try:
    T.test_a_kernelbench_task_with_a_gigabyte_of_output_fits_four_footprints_and_writes_nothing_big(tmp)
finally:
    print({k: (round(v, 2), cnt[k]) for k, v in acc.items()})
