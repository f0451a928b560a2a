"""unittest users: the FSDPTestCase base class and the parameterized helpers (pytest runs
these TestCases through unittest's own machinery)."""
from __future__ import annotations

from examples.my_model import GatedNet, batch, loss, make_optimizer
from fsdp_conformance.cases import Case
from fsdp_conformance.user.unittest_support import FSDPTestCase, conformance_cases, world_sizes

MODEL = dict(plan=["body", "head"], optimizer=make_optimizer, loss=loss, fsdp_version=1)
USER = dict(MODEL, paths=["fsdp1.full"])


class TestGatedNet(FSDPTestCase):
    @world_sizes(1, "2->1")
    def test_roundtrip(self, ws):
        [r] = self.assertRoundtrip(GatedNet, batch, world_sizes=[ws], **USER)
        self.assertEqual(r.properties["P6"].status, "pass")
        self.assertEqual(r.case.dst_world_size, 1)

    def test_planted_bug_fails_with_the_plugins_message(self):
        with self.assertRaises(self.failureException) as cm:
            self.assertRoundtrip(GatedNet, batch, world_sizes=[1], **MODEL,
                                 save_fn="suites.plugin.userfns:save_dropping_lr",
                                 load_fn="suites.plugin.userfns:load")
        msg = str(cm.exception)
        self.assertIn("P11 (param groups) FAIL", msg)
        self.assertIn("[1]['lr']: missing; expected 0.001, got <absent>", msg)
        self.assertIn("rerun just this case: python -m unittest suites.plugin.test_unittest_support"
                      ".TestGatedNet.test_planted_bug_fails_with_the_plugins_message", msg)

    @conformance_cases([Case(api="fsdp1.full", optimizer="sgd_momentum", world_size=1,
                             load_world_size=2)])
    def test_zoo_case(self, case):
        r = self.assertCaseConforms(case)
        self.assertEqual(r.properties["P3"].status, "pass")

    def test_rank_pool(self):
        self.assertEqual(self.rank_pool(2).world_size, 2)


def test_parameterized_method_names():
    names = {n for n in dir(TestGatedNet) if n.startswith("test_")}
    assert {"test_roundtrip_ws1", "test_roundtrip_ws2_to_1"} <= names
    assert "test_zoo_case_0_fsdp1_full_sgd_momentum_mlp_nested_flat_ws1_to_2_fp64" in names
    assert TestGatedNet.test_roundtrip is None  # the bare method is gone (not run unparametrized)
