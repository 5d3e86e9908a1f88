"""The ``--device`` of the scripts that run a checkpoint's model (``scripts.predict``, ``scripts.probe``), checked
before any work: a device torch does not know (``tpu``) or this machine does not have (``cuda:99``, ``cuda`` without
CUDA) stops with one line naming the flag, the value and the devices here. (``train.py``'s ``trainer.device`` is
checked by ``training.schema``.)"""

import torch


def device_choices() -> list[str]:
    """The devices of this machine, as ``--device`` takes them: ``cpu``, then with N CUDA devices ``cuda`` (the
    current one) and ``cuda:0`` .. ``cuda:N-1``, then ``mps`` where Apple's backend is available."""
    cuda = [] if not torch.cuda.is_available() else ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    return ["cpu", *cuda, *(["mps"] if torch.backends.mps.is_available() else [])]


def parse_device(name: str, flag: str = "--device") -> torch.device:
    """``name`` as a torch device of this machine (any ``cpu`` spelling, else one of :func:`device_choices`).

    Raises:
        ValueError: ``name`` is no torch device, or none of this machine's; the message names ``flag``, ``name`` and
            the valid choices.
    """
    choices = device_choices()
    try:
        device = torch.device(name)
    except RuntimeError:  # torch's message lists every device type it was built to know, most of them absent here
        device = None
    if device is None or (device.type != "cpu" and str(device) not in choices):
        raise ValueError(f"{flag} {name!r} is not a device of this machine; valid: {', '.join(choices)}")
    return device
