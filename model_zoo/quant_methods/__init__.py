"""The quant methods hwplug ships (implementations of :class:`hwplug.QuantMethod`), one
module each, registered by :mod:`hwplug.model_zoo.plugin`."""
