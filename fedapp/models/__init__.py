"""The `nn.Module`s of the torch methods (CCFC's encoder/projector/predictor, FSTC's clustering head and
adapter, ProdLDA/CombinedTM), one module per network family.

Networks only: no training loop, no Flower, no device choice. The training loop, weights <-> arrays,
device, seeding and the state that survives rounds come from `fedapp.neural.glue` and
`fedapp.neural.training`;
losses and method maths live beside their client or strategy.
"""
