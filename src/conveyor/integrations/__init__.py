"""Training frameworks that keep a conveyor loader (docs/integrations.md).

* ``conveyor.integrations.accelerate``: Hugging Face Accelerate. Its
  ``Accelerator`` (a subclass of accelerate's) prepares a conveyor loader as
  conveyor: each rank's share, batches on ``accelerator.device``,
  end-of-epoch tracking, and ``save_state``/``load_state`` resuming exactly.
* ``conveyor.integrations.transformers``: ``transformers.Trainer`` training
  through conveyor (``ConveyorTrainer``, or ``ConveyorTrainerMixin`` for a
  Trainer subclass of your own), resuming mid-epoch from a checkpoint.

Lightning and Ray Train need nothing from here: they accept a
``conveyor.torch.DataLoader`` as torch's (docs/distributed.md). When
accelerate is about to rebuild a conveyor loader as torch's own, conveyor
warns with :class:`RebuiltLoaderWarning` and says what to use instead.

Nothing here is imported by ``import conveyor``; each module imports its
framework when it is imported itself.
"""

from ._rebuild import RebuiltLoaderWarning

__all__ = ["RebuiltLoaderWarning"]
