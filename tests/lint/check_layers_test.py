#!/usr/bin/env python3
"""scripts/check_layers.py on small trees: it passes a tree that keeps the floors and fails, naming the
file and line, on each kind of inverted include."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "check_layers.py")


def run(files):
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        p = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
        return p.returncode, p.stdout


GOOD = {
    "common/base/logging.h": "#pragma once\n",
    "common/tensor/dtype.h": '#include "common/base/logging.h"\n',
    "common/backend/backend.h": '#include "common/tensor/dtype.h"\n#include <vector>\n#include "absl/status/status.h"\n',
    "common/backend/create_backend.cc": '#include "common/backend/cpu/cpu_backend.h"\n',
    "common/backend/cpu/cpu_backend.h": '#include "common/backend/backend.h"\n',
    "common/model/llama_model.h": '#include "common/backend/backend.h"\n#include "common/model/config.h"\n',
    "common/model/config.h": "",
    "common/rpc/dtype_proto.h": '#include "tandem/v1/model.pb.h"\n',
    "cli/make_model.cc": '#include "cli/presets.h"\n#include "common/model/config.h"\n',
    "tests/unit/x_test.cc": '#include "cli/presets.h"\n#include "router/cluster.h"\n',
}


class CheckLayersTest(unittest.TestCase):
    def test_a_tree_that_keeps_the_floors_passes(self):
        code, out = run(GOOD)
        self.assertEqual(code, 0, out)
        self.assertIn("none upward", out)

    def assert_refused(self, path, text, expected):
        code, out = run({**GOOD, path: text})
        self.assertEqual(code, 1, out)
        self.assertIn(expected, out)

    def test_the_backend_including_the_model_floor_fails(self):
        self.assert_refused("common/backend/backend.h", '#include "common/model/config.h"\n',
                            "common/backend/backend.h:1: common/backend (floor 3) includes common/model/config.h")

    def test_a_backend_including_the_other_fails(self):
        self.assert_refused("common/backend/cuda/kernels.h", '#include "common/backend/cpu/cpu_backend.h"\n',
                            "common/backend/cuda/kernels.h:1:")

    def test_neighbours_on_one_floor_fail(self):
        self.assert_refused("common/kv/block_pool.h", '\n#include "common/tokenizer/tokenizer.h"\n',
                            "common/kv/block_pool.h:2: common/kv (floor 1) includes common/tokenizer")

    def test_product_code_including_tests_or_an_app_fails(self):
        self.assert_refused("common/engine/engine.cc", '#include "tests/support/cuda_emu/cuda_emu.h"\n',
                            "common/engine/engine.cc:1:")
        self.assert_refused("router/cluster.cc", '#include "cli/presets.h"\n', "router/cluster.cc:1:")
        self.assert_refused("common/tensor/dtype.h", '#include "tandem/v1/model.pb.h"\n', "common/tensor/dtype.h:1:")

    def test_a_module_without_a_floor_fails(self):
        self.assert_refused("common/newthing/x.h", '#include "common/base/logging.h"\n', "has no floor")


if __name__ == "__main__":
    unittest.main()
