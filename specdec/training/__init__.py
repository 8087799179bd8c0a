"""Training-side building blocks in the core: anchors, block batches, the drafter's training
forward, pre-verifier packing and the SD simulation loop. Pure torch; never imports ray (the
Ray Data / Ray Train jobs in ``pipelines/`` call these)."""
