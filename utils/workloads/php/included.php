<?php
// Included by phpworkload.php's eval mode: the chain's top called from
// eval'd code in an included file.
namespace Shop;

eval('\Shop\top($deadline);'); # hot: eval
