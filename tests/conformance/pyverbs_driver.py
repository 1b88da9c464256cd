# Runs inside a copy of rdma-core's test directory: loads its `tests`
# package the way run_tests.py does, runs the named modules, and prints one
# JSON line per test: {"id", "outcome", "detail"}.
import json
import os
import sys
import unittest
from importlib.machinery import SourceFileLoader

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
modules = sys.argv[1:]
sys.argv = [sys.argv[0]]
from args_parser import parser  # noqa: E402

tests = SourceFileLoader('tests', os.path.join(here, '__init__.py')).load_module()
parser.parse_args()


class Recorder(unittest.TestResult):
    def _emit(self, test, outcome, detail=''):
        print(json.dumps({'id': test.id(), 'outcome': outcome, 'detail': detail}), flush=True)

    def addSuccess(self, test):
        self._emit(test, 'pass')

    def addFailure(self, test, err):
        self._emit(test, 'fail', self._exc_info_to_string(err, test)[-1500:])

    def addError(self, test, err):
        self._emit(test, 'error', self._exc_info_to_string(err, test)[-1500:])

    def addSkip(self, test, reason):
        self._emit(test, 'skip', reason)

    def addExpectedFailure(self, test, err):
        self._emit(test, 'pass')

    def addUnexpectedSuccess(self, test):
        self._emit(test, 'fail', 'unexpected success')


loader = unittest.TestLoader()
suite = unittest.TestSuite()
for mod in tests.__test_modules__:
    if mod.__name__.split('.')[-1] in modules:
        suite.addTests(loader.loadTestsFromModule(mod))
suite.run(Recorder())
